// The scenario suite (docs/SIMULATOR.md "The scenario suite"): sequences drawn
// from a seeded generator over model sets, machines and prompt patterns, each
// replayed for every policy and compared with the oracle (Note [Simulator
// oracle] in replay.h), with mru and with lru. It is how a policy is judged on
// workflows nobody tuned it for; the bundled traces are four cases of it.
//
// Note [Simulator suite]
// Scenario i of seed s draws from a std::mt19937_64 seeded with (s, i), so a
// scenario is the same whatever the count and whichever thread replays it.
// Its pattern is kPatterns[i % 8]: every pattern appears once in any eight
// consecutive scenarios. The rest is drawn:
//   machine    RAM 16-128 GiB, VRAM 8-48 GiB, other_ram 3-6 GiB, no
//              headroom: the one pins derives from the RAM (Note [Derived
//              budget], 1-4 GiB)
//   workflows  one to three (by pattern), each a family: WAN 2.2 A14B (two
//              experts), WAN 2.1 14B, Flux.1-dev, SDXL with and without the
//              refiner (layers from the parameter list), or of plausible sizes
//              without one there: an SD3.5-class 8B, a 20B-class DiT with a 7B
//              encoder, a 2B distilled model; samplers and large encoders at 1
//              or 2 bytes per parameter; sampler steps from the family's range;
//              0-2 of three LoRA styles (0.5-3% of the sampler's bytes). Two
//              workflows of one family share its models, as one checkpoint
//              file loaded twice is one model to the application.
//   runs       6-10 (8-12 with three workflows); a run is full (the encoders
//              run) or seed-only (a new seed: the encoders' outputs are cached,
//              so only the samplers and the VAE run); a workflow's first run,
//              and any run after another workflow's, is full.
// Figures are over the runs after each sequence's first (the first run is cold
// for every policy, so it only dilutes the differences).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "profiling/data/model_params.h"
#include "profiling/sim/replay.h"
#include "profiling/sim/trace.h"

namespace pins::sim {

// What happens from one run to the next (Note [Simulator suite]).
enum class Pattern {
  Rerun,             // the same prompt every run (a script, --cache-none)
  SeedPrompt,        // seed changes and prompt changes in any order
  LoraSwap,          // LoRAs swapped, added and removed at random between runs
  OneOff,            // one workflow, another run once or twice in between
  TwoAlternating,    // two workflows A B A B
  TwoInterleaved,    // two workflows in an irregular order
  ThreeAlternating,  // three workflows A B C A B C
  ThreeInterleaved,  // three workflows in an irregular order
};
inline constexpr int kPatternCount = 8;
const char* to_string(Pattern p);
// The pattern of scenario `index`: every pattern in each ten consecutive
// scenarios, seed-prompt three times (a seed change is the most common
// sequence in ComfyUI, Note [Simulator suite]).
inline constexpr int kScheduleLength = 10;
Pattern pattern_of(int index);

struct Scenario {
  uint64_t seed = 0;
  int index = 0;
  Pattern pattern = Pattern::Rerun;
  std::string name;  // "s<seed>-<index>-<pattern>-<ram>g-<vram>g-<families>"
  Trace trace;       // one sequence, its prompts listed run by run
  std::string json;  // the trace file it was parsed from (pins-sim --suite --write-trace)
};

// Scenario `index` of `seed`; `params` is the parameter list the families read.
Scenario make_scenario(uint64_t seed, int index, const std::vector<model_params::Model>& params);

// One scenario's figures over the runs after its first.
struct SuiteRow {
  std::vector<uint64_t> disk;  // per policy, in SuiteResult::policies order
  uint64_t ram_bound = 0;      // the RAM bound over those runs (Note [Simulator lower bound])
  uint64_t allowance = 0;      // one largest layer per run counted
  int runs = 0;                // runs counted (all but the first)
  // The oracle reads more than the machine's RAM a run: a sequence that
  // thrashes whatever the policy, which nobody runs twice (reported apart).
  bool thrashing = false;
};

struct SuiteResult {
  uint64_t seed = 0;
  std::vector<std::string> policies;  // the balancer's policies, then "oracle"
  std::vector<Scenario> scenarios;
  std::vector<SuiteRow> rows;  // per scenario
  int policy_index(const std::string& p) const;  // -1 when absent
};

// Scenarios [0, count) of `seed`, replayed for `policies` (the balancer's; the
// oracle is added) on `threads` threads (at least 1).
SuiteResult run_suite(uint64_t seed, int count, const std::vector<std::string>& policies,
                      const std::vector<model_params::Model>& params, const ReplayOptions& options, int threads);

// One policy over the suite (docs/SIMULATOR.md "The scenario suite").
struct SuiteFigures {
  std::string policy;
  double total = 0;      // disk bytes, every scenario
  double vs_oracle = 0;  // total / the oracle's total
  double vs_oracle_steady = 0;  // the same without the thrashing scenarios (SuiteRow::thrashing)
  int thrashing = 0;            // those scenarios
  // Per scenario disk / the oracle's, over the scenarios where the oracle reads.
  double median = 0, p90 = 0, worst = 0;
  int worst_scenario = -1;
  int oracle_reads = 0;           // scenarios where the oracle reads something
  int oracle_zero_over = 0;       // scenarios where the oracle reads nothing and this more than the allowance
  double oracle_zero_excess = 0;  // the most bytes read where the oracle reads nothing
  int over_mru = 0, over_lru = 0;  // scenarios reading more than mru (lru) + the allowance
  double worst_over_mru = 0, worst_over_lru = 0;  // the most bytes over mru (lru), in allowances (1 = one layer a run)
  // Over the lesser of mru and lru per scenario (issue 24's criterion: a
  // policy should not lose to whichever simple order suits the scenario);
  // 0 unless both were replayed.
  int over_min = 0;
  double worst_over_min = 0;  // in allowances
  int below_ram_bound = 0;  // scenarios reading less than the RAM bound (0 for every policy, or the model is wrong)
  int below_oracle = 0;     // scenarios reading less than the oracle (Belady is a heuristic with mixed sizes)
};
std::vector<SuiteFigures> suite_figures(const SuiteResult& r);

// Whether `f` meets the suite's targets: vs_oracle <= 1.10, worst <= 1.25, no
// scenario over mru or lru by more than the allowance, none over the allowance
// where the oracle reads nothing.
bool meets_targets(const SuiteFigures& f);

// The report: a line per policy, per pattern the default policy's ratio, its
// worst scenarios, and a closing `RESULT ...` line for `default_policy`.
void print_suite(std::ostream& os, const SuiteResult& r, const std::string& default_policy);
// One CSV row per scenario and policy.
void write_suite_csv(std::ostream& os, const SuiteResult& r);

}  // namespace pins::sim
