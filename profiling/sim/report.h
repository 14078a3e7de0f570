// What the simulator prints: the per-run table, the JSON object, CSV rows, the
// markdown summary rows of docs/SIMULATOR.md, and the claims about the policies
// (Note [Simulator claims]) checked on every sequence. The PNG plot is drawn
// from the JSON by profiling/sim/plot.py.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "profiling/sim/expand.h"
#include "profiling/sim/replay.h"
#include "profiling/sim/trace.h"

namespace pins::sim {

struct SequenceResult {
  const Sequence* sequence = nullptr;
  Expansion expansion;
  std::vector<PolicyResult> policies;
  uint64_t tolerance = 0;
  const PolicyResult* find(const std::string& policy) const;
};

// Averages over the last period of runs (one cycle of the sequence).
struct SteadyFigures {
  double used = 0, cache = 0, lower_bound = 0;
};
SteadyFigures steady_figures(const SequenceResult& r);
double steady_disk(const SequenceResult& r, const PolicyResult& p);

// The claims on one sequence; a claim is absent when its policy did not run.
//
// Note [Simulator claims]
//   cascade   where the steady W exceeds C, lru reads at least 90% of W per steady run
//   mru       the steady state (Note [Simulator steady state]) starts by run 3
//   trace     from the second cycle of the repeating part on, every window of one
//             period (one run; one cycle of an alternating sequence) reads at most
//             1.05 x its bound (window_bound) + one largest layer per run. For a
//             rerun that is "from the second run on"; where a different first
//             prompt precedes the cycle (the text encoder ran only in run 1) it
//             starts at run 3, the first run whose predecessor is like it; for two
//             alternating workflows at run 3, after each ran once
struct Checks {
  bool w_exceeds_c = false;               // steady W > C
  std::optional<double> lru_disk_over_w;  // lru steady disk / W
  std::optional<bool> lru_cascade;        // W > C and lru reads >= 90% of W
  std::optional<int> mru_steady_run;      // 1-based; 0: not reached
  std::optional<bool> mru_steady_within_3;
  std::optional<double> trace_worst_excess;  // max over windows from run 2 of disk - (1.05 bound + layers), bytes
  std::optional<int> trace_worst_run;        // 1-based first run of that window
  std::optional<bool> trace_within_bound;
  std::optional<double> oracle_worst_excess;  // the same for the oracle: > 0 means no policy with C bytes meets it
  std::optional<bool> oracle_within_bound;
};
Checks check(const Trace& t, const SequenceResult& r);

nlohmann::ordered_json to_json(const Trace& t, const SequenceResult& r);
void print_table(std::ostream& os, const Trace& t, const SequenceResult& r);
void write_csv_header(std::ostream& os);
void write_csv(std::ostream& os, const Trace& t, const SequenceResult& r);
void write_markdown_header(std::ostream& os);
void write_markdown_row(std::ostream& os, const Trace& t, const SequenceResult& r);
// One JSON line per access (docs/SIMULATOR.md "Access dump").
void dump_accesses(std::ostream& os, const Trace& t, const SequenceResult& r);

std::string gib(double bytes, int decimals = 2);

}  // namespace pins::sim
