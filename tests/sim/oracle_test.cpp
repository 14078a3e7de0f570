// The Belady oracle (profiling/sim/replay.h) against a brute-force optimum on
// access sequences small enough to search exhaustively.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "profiling/sim/replay.h"

namespace pins::sim {
namespace {

Trace machine_only() {
  Trace t;
  t.machine.ram = 1ull << 40;
  t.machine.vram = 1ull << 30;
  t.machine.disk_read_bw = 1e9;
  t.machine.ram_copy_bw = 1e10;
  t.machine.h2d_bw = 2e10;
  return t;
}

// One run, one step: weights `keys` with `sizes[key]` bytes, capacity `cap`.
Expansion sequence(const std::vector<int>& keys, const std::vector<uint64_t>& sizes, uint64_t cap) {
  Expansion e;
  RunPlan plan;
  plan.bound.pin_capacity = cap;  // oracle-pins
  plan.bound.ram_capacity = cap;  // oracle
  StepPlan sp;
  for (int k : keys) {
    Access a;
    a.storage = static_cast<uint64_t>(k) + 1;
    a.bytes = sizes[k];
    a.layer = k;
    e.accesses.push_back(a);
  }
  sp.end = e.accesses.size();
  plan.steps.push_back(sp);
  e.runs.push_back(plan);
  return e;
}

// The fewest bytes read over every caching decision: after a miss the cache may
// become any subset of (cache + the key) that fits (keeping, bypassing, or
// evicting anything). Dynamic programming over (position, cached set).
uint64_t brute_force(const std::vector<int>& keys, const std::vector<uint64_t>& sizes, uint64_t cap) {
  const int n = static_cast<int>(sizes.size());
  const auto weight = [&](unsigned set) {
    uint64_t w = 0;
    for (int i = 0; i < n; ++i)
      if (set & (1u << i)) w += sizes[i];
    return w;
  };
  constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max() / 2;
  std::map<unsigned, uint64_t> cost = {{0u, 0}};
  for (int k : keys) {
    std::map<unsigned, uint64_t> next;
    for (const auto& [set, c] : cost) {
      if (set & (1u << k)) {
        auto [it, fresh] = next.emplace(set, c);
        if (!fresh) it->second = std::min(it->second, c);
        continue;
      }
      const unsigned with = set | (1u << k);
      for (unsigned sub = with;; sub = (sub - 1) & with) {  // every subset of `with`
        if (weight(sub) <= cap) {
          auto [it, fresh] = next.emplace(sub, c + sizes[k]);
          if (!fresh) it->second = std::min(it->second, c + sizes[k]);
        }
        if (sub == 0) break;
      }
    }
    cost = std::move(next);
  }
  uint64_t best = kInf;
  for (const auto& [set, c] : cost) best = std::min(best, c);
  return best;
}

TEST(SimOracle, EqualSizesMatchTheBruteForceOptimum) {
  const Trace t = machine_only();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int nkeys = 3 + static_cast<int>(rng() % 5);  // 3..7 weights
    const int len = 6 + static_cast<int>(rng() % 16);
    const uint64_t cap = 1 + rng() % 3;                 // 1..3 weights
    std::vector<int> keys;
    for (int i = 0; i < len; ++i) keys.push_back(static_cast<int>(rng() % nkeys));
    const std::vector<uint64_t> sizes(nkeys, 1);
    const PolicyResult r = replay_oracle(t, sequence(keys, sizes, cap));
    ASSERT_EQ(r.runs.at(0).disk_bytes, brute_force(keys, sizes, cap)) << "trial " << trial;
  }
}

TEST(SimOracle, CyclicLoopReadsExactlyTheExcess) {
  // Belady on a loop of 5 equal weights with room for 3, ten times: after the
  // cold pass, every pass reads 2 (W - C), the physical limit of DESIGN.md.
  std::vector<int> keys;
  for (int pass = 0; pass < 10; ++pass)
    for (int k = 0; k < 5; ++k) keys.push_back(k);
  const std::vector<uint64_t> sizes(5, 1);
  const PolicyResult r = replay_oracle(machine_only(), sequence(keys, sizes, 3));
  EXPECT_EQ(r.runs[0].disk_bytes, 5u + 9 * 2);
  EXPECT_EQ(brute_force(keys, sizes, 3), 5u + 9 * 2);
}

TEST(SimOracle, MixedSizesAreNeverBelowTheOptimum) {
  // Size-aware Belady is a heuristic when sizes differ: it never beats the optimum
  // and stays close to it on small cases.
  const Trace t = machine_only();
  std::mt19937 rng(11);
  uint64_t oracle_total = 0, best_total = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int nkeys = 3 + static_cast<int>(rng() % 4);
    std::vector<uint64_t> sizes;
    for (int i = 0; i < nkeys; ++i) sizes.push_back(1 + rng() % 4);
    const uint64_t cap = 2 + rng() % 6;
    std::vector<int> keys;
    const int len = 6 + static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) keys.push_back(static_cast<int>(rng() % nkeys));
    const uint64_t oracle = replay_oracle(t, sequence(keys, sizes, cap)).runs[0].disk_bytes;
    const uint64_t best = brute_force(keys, sizes, cap);
    ASSERT_GE(oracle, best) << "trial " << trial;
    oracle_total += oracle;
    best_total += best;
  }
  EXPECT_LE(static_cast<double>(oracle_total), 1.15 * static_cast<double>(best_total));
}

TEST(SimOracle, PatchesAreNeverCachedNorRead) {
  Expansion e = sequence({0, 0}, {8}, 100);
  Access patch = e.accesses[0];
  patch.kind = Kind::Patches;
  patch.storage = 99;
  e.accesses.insert(e.accesses.begin() + 1, patch);
  e.runs[0].steps[0].end = e.accesses.size();
  const PolicyResult r = replay_oracle(machine_only(), e);
  EXPECT_EQ(r.runs[0].disk_bytes, 8u);
  EXPECT_EQ(r.runs[0].pin_hits, 1);
  EXPECT_EQ(r.runs[0].refusals, 1);
}

TEST(SimSteady, FirstRunFromWhichEveryPeriodRepeats) {
  Sequence s;
  s.prompts = {0};
  std::vector<RunResult> runs(6);
  const uint64_t d[] = {100, 60, 41, 40, 40, 40};
  for (int i = 0; i < 6; ++i) runs[i].disk_bytes = d[i];
  EXPECT_EQ(steady_run(s, runs, 0), 3);
  EXPECT_EQ(steady_run(s, runs, 1), 2);
  Sequence alt;
  alt.prompts = {0, 1};
  const uint64_t a[] = {100, 90, 50, 70, 50, 70};
  for (int i = 0; i < 6; ++i) runs[i].disk_bytes = a[i];
  EXPECT_EQ(steady_run(alt, runs, 0), 2);
  runs[5].disk_bytes = 75;
  EXPECT_EQ(steady_run(alt, runs, 0), -1) << "the last comparison differs: not steady within the runs";
}

}  // namespace
}  // namespace pins::sim
