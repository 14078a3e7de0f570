// The balancer's counters as one plain struct: Balancer::stats() fills it, the
// simulator and the tests read its fields, and only the torch op pins::stats
// (ops/stats/stats.cpp) names them as strings. Levels say so; the rest are COUNTs
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
  SubsetStats subsets[kSubsets];   // indexed by Subset
  SubsetStats total;               // the four subsets summed
  int64_t refusals = 0;            // COUNT pins the budget refused
  bool active = false;             // level: executing now
  bool in_prompt = false;          // level: marked by the current prompt
};

struct BalancerStats {
  std::vector<ModelStats> models;  // every registered model, by id
  SubsetStats subsets[kSubsets];   // each subset summed over the models
  SubsetStats total;               // every model and subset summed
  int64_t refusals = 0;            // COUNT pins the budget refused, forgotten models included
  int64_t busy_misses = 0;         // COUNT hits on a pin still filling or being evicted
  int64_t pressure_freed_bytes = 0;  // SUM bytes freed by relieve()
  int64_t relieve_calls = 0;       // COUNT
  int64_t trace_departures = 0;    // COUNT prompts that departed from every record (Note [Trace policy])
  int64_t trace_records = 0;       // level: prompt records kept
  bool prompt = false;             // level: a prompt is running
};

}  // namespace pins
