// The balancer's counters as one plain struct: Balancer::stats() fills it, the
// simulator and the tests read its fields, and only the torch op pins::stats
// (ops/stats.cpp) names them as strings. Levels say so; the rest are COUNTs
// or SUMs since the balancer was built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "csrc/balancer/registry.h"

namespace pins {

struct ModelStats {
  ModelId id = -1;
  std::string name;                // as registered
  std::string load_device;         // as registered
  ModelOptions options;            // as registered
  SubsetStats subsets[kSubsets];   // indexed by Subset
  SubsetStats total;               // the four subsets summed
  int64_t refusals = 0;            // COUNT pins the budget or the pool refused
  int64_t bypassed[kBypassReasons] = {};  // COUNT casts served from the source, by Bypass
  bool active = false;             // level: executing now
  bool in_prompt = false;          // level: marked by the current prompt
  // level: its weight bytes on its device as the application last said (Note
  // [Spared layers on the device]); -1 until it says.
  int64_t device_bytes = -1;

  int64_t bypassed_all() const {  // COUNT casts served from the source, every reason
    int64_t n = 0;
    for (int64_t b : bypassed) n += b;
    return n;
  }
};

struct BalancerStats {
  std::vector<ModelStats> models;  // every registered model, by id
  SubsetStats subsets[kSubsets];   // each subset summed over the models
  SubsetStats total;               // every model and subset summed
  int64_t refusals = 0;            // COUNT pins the budget or the pool refused, forgotten models included
  int64_t busy_misses = 0;         // COUNT hits on a pin still filling or being evicted
  int64_t bypassed[kBypassReasons] = {};  // COUNT casts for a model served from the source, by Bypass,
                                          // forgotten models included
  int64_t plain_copies = 0;        // COUNT casts without a model (model=-1): plain copies by request
  int64_t pressure_freed_bytes = 0;  // SUM bytes freed by relieve()
  int64_t relieve_calls = 0;       // COUNT
  int64_t trace_departures = 0;    // COUNT prompts that departed from every record (Note [Trace policy])
  int64_t trace_records = 0;       // level: prompt records kept
  int64_t trace_bytes = 0;         // level: bytes the records and the current prompt's hold (Note [Trace memory])
  // COUNT verdicts on the trace's prediction rules (Note [Rule checks]).
  int64_t rule_first_seen_wrong = 0, rule_first_seen_right = 0;
  int64_t rule_conditioning_wrong = 0, rule_conditioning_right = 0;
  int64_t reuse_keys = 0;          // level: sources the reuse policy's history holds (Note [Reuse policy])
  bool prompt = false;             // level: a prompt is running

  int64_t bypassed_all() const {  // COUNT casts for a model served from the source, every reason
    int64_t n = 0;
    for (int64_t b : bypassed) n += b;
    return n;
  }
};

}  // namespace pins
