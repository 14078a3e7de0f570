// Note [Cap budget] (csrc/balancer/budget_gate.h): the pool's cap is a budget
// the balancer frees for along its tiers, as for RAM, so the policy chooses
// what stays under it. RAM is plentiful in every scenario here: only the cap
// binds.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "csrc/balancer/balancer.h"
#include "csrc/base/size.h"
#include "csrc/pool/backend.h"
#include "tests/csrc/pool/pool_fixture.h"

namespace pins {
namespace {

constexpr uint64_t U = 4 * MiB;  // one pin: more than half an extent_min (1 MiB) extent, so an extent of its own

// 64 GiB of RAM, all of it available whatever the pool holds.
class PlentyProbe : public MemoryProbe {
 public:
  MemoryInfo read() override {
    MemoryInfo m;
    m.total = 64 * GiB;
    m.available = 48 * GiB;
    return m;
  }
};

Config config(PolicyKind policy) {
  Config c;
  c.policy = policy;
  c.headroom = 4 * GiB;
  c.pin_slack = 0;
  c.relieve_slack = 0;
  c.ceiling_min = 0;
  c.ceiling_max = 1;
  c.ceiling_reserve = 0;
  c.ceiling_swap_reserve = 0;
  return c;
}

struct Fixture {
  Fixture(size_t cap, PolicyKind policy) : pool(make_null_backend(), opts(cap)), bal(config(policy), pool, probe) {}
  static PoolOptions opts(size_t cap) {
    PoolOptions o = testing::pool_opts();
    o.cap = cap;
    return o;
  }
  // true when a pin served the cast (hit or new)
  bool cast(ModelId m, uint64_t key, uint64_t bytes = U) {
    Request r;
    r.model = m;
    r.key = PinKey{key, 0, bytes};
    r.bytes = bytes;
    Lease l = bal.acquire(r);
    if (!l) return false;
    if (l.needs_fill()) l.filled();
    return true;
  }
  std::vector<uint64_t> keys(ModelId m) {
    std::vector<uint64_t> out;
    for (const auto& p : bal.pins())
      if (p.model == m) out.push_back(p.key.storage);
    std::sort(out.begin(), out.end());
    return out;
  }
  HostPool pool;
  PlentyProbe probe;
  Balancer bal;
};

// One prompt's counters.
struct Row {
  int64_t hits = 0, misses = 0, evictions = 0, refused = 0, pool = 0;
  bool operator==(const Row&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Row& r) {
  return os << "{hits " << r.hits << ", misses " << r.misses << ", evictions " << r.evictions << ", refused "
            << r.refused << ", pool " << r.pool << "}";
}

// Two models of 4 pins each under a cap of 6 pins, prompts alternating a, b,
// a, b, ...: each prompt casts its model's keys in order, `passes` times
// (sampler steps). Returns each prompt's counters.
std::vector<Row> alternate(PolicyKind policy, int passes, int prompts = 6) {
  Fixture f(6 * U, policy);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  std::vector<Row> rows;
  for (int i = 0; i < prompts; ++i) {
    const ModelId m = i % 2 == 0 ? a : b;
    const BalancerStats before = f.bal.stats();
    f.bal.mark_prompt({m});
    for (int pass = 0; pass < passes; ++pass)
      for (uint64_t k = 0; k < 4; ++k) f.cast(m, 100 * (m + 1) + k);
    f.bal.end_prompt();
    const BalancerStats after = f.bal.stats();
    Row r;
    r.hits = after.total.hits - before.total.hits;
    r.misses = after.total.misses - before.total.misses;
    r.evictions = after.total.evictions_all() - before.total.evictions_all();
    r.refused = after.bypassed[static_cast<int>(Bypass::Refused)] - before.bypassed[static_cast<int>(Bypass::Refused)];
    r.pool = after.bypassed[static_cast<int>(Bypass::Pool)] - before.bypassed[static_cast<int>(Bypass::Pool)];
    rows.push_back(r);
    EXPECT_LE(f.pool.stats().committed_bytes.peak, static_cast<int64_t>(6 * U));
    f.pool.check_invariants();
  }
  return rows;
}

// mru: a new pin past the cap takes the other model's pins (tier 1), its
// newest first; the pool refuses nothing while they are there. Each prompt
// then finds its two newest pins gone and takes the other's two newest.
TEST(BalancerCap, UnderMruEachPromptTakesTheOtherModelsNewestPins) {
  const std::vector<Row> rows = alternate(PolicyKind::Mru, /*passes=*/1);
  EXPECT_EQ(rows[0], (Row{0, 4, 0, 0, 0})) << "a's four pins fit";
  EXPECT_EQ(rows[1], (Row{0, 4, 2, 0, 0})) << "b's last two take a's newest two";
  for (size_t i = 2; i < rows.size(); ++i) EXPECT_EQ(rows[i], (Row{2, 2, 2, 0, 0})) << "prompt " << i;
}

// trace: from the third prompt on it follows a's record, which predicts b's
// pins for the next prompt and a's missing ones only for the prompt after
// (each key is used once a prompt): Belady's other half (Note [Trace bypass])
// refuses them rather than take b's. b then hits everything; a reads the same
// two from their sources every turn and nothing is evicted. Half mru's misses.
TEST(BalancerCap, UnderTheTraceTheModelThatComesNextKeepsItsPins) {
  const std::vector<Row> rows = alternate(PolicyKind::Trace, /*passes=*/1);
  EXPECT_EQ(rows[0], (Row{0, 4, 0, 0, 0}));
  EXPECT_EQ(rows[1], (Row{0, 4, 2, 0, 0})) << "no record of b yet: mru's order";
  for (size_t i = 2; i < rows.size(); i += 2) EXPECT_EQ(rows[i], (Row{2, 2, 0, 2, 0})) << "prompt " << i;
  for (size_t i = 3; i < rows.size(); i += 2) EXPECT_EQ(rows[i], (Row{4, 0, 0, 0, 0})) << "prompt " << i;
}

// With two passes a prompt, a missing pin is used again in this prompt's
// second pass, before anything of the other model: the trace takes the other
// model's farthest pins (its last ones), which are mru's newest. Both policies
// count the same, and every second pass hits.
TEST(BalancerCap, WithTwoPassesAPromptTheTraceTakesWhatMruTakes) {
  const std::vector<Row> mru = alternate(PolicyKind::Mru, /*passes=*/2);
  const std::vector<Row> trace = alternate(PolicyKind::Trace, /*passes=*/2);
  EXPECT_EQ(mru, trace);
  EXPECT_EQ(mru[1], (Row{4, 4, 2, 0, 0}));
  for (size_t i = 2; i < mru.size(); ++i) EXPECT_EQ(mru[i], (Row{6, 2, 2, 0, 0})) << "prompt " << i;
}

// Pins of a quarter extent share their extents (Note [Host pool layout]):
// a's eight fill the cap's two extents, 0-3 and 4-7. lru takes 0, 2, 4, 6
// first (the order they were last used in), which leaves both extents half
// used: the cap gains nothing, so the next pins go one at a time, 1 and then
// 3, which leaves the first extent idle for b's pin of a whole extent.
TEST(BalancerCap, AFreedBlockOfASharedExtentGivesNoRoomUntilTheExtentIsIdle) {
  Fixture f(2 * MiB, PolicyKind::Lru);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  const uint64_t q = 256 * KiB;
  for (uint64_t k = 0; k < 8; ++k) ASSERT_TRUE(f.cast(a, k, q));
  for (uint64_t k : {0, 2, 4, 6, 1, 3, 5, 7}) ASSERT_TRUE(f.cast(a, k, q));
  EXPECT_EQ(f.pool.committed_bytes(), 2 * MiB);
  f.bal.mark_prompt({b});
  ASSERT_TRUE(f.cast(b, 100, 1 * MiB));
  EXPECT_EQ(f.keys(a), (std::vector<uint64_t>{5, 7}));
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 6);
  EXPECT_EQ(f.bal.stats().bypassed_all(), 0);
  EXPECT_LE(f.pool.stats().committed_bytes.peak, static_cast<int64_t>(2 * MiB));
  // A pin that fits a freed block takes it: nothing more is evicted.
  ASSERT_TRUE(f.cast(b, 101, q));
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 6);
  EXPECT_EQ(f.pool.committed_bytes(), 2 * MiB);
  f.pool.check_invariants();
}

// A pin no freeing can fit (larger than the cap) evicts nothing: the pool
// refuses it. A pin that the tiers cannot make room for (the prompt's own
// pins are not theirs to take) is refused by the budget, having freed what it
// could.
TEST(BalancerCap, WhatNoFreeingFitsEvictsNothingAndWhatTheTiersCannotFreeIsRefused) {
  Fixture f(4 * U, PolicyKind::Mru);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(a, k));
  f.bal.mark_prompt({b});
  EXPECT_FALSE(f.cast(b, 100, 5 * U));
  BalancerStats st = f.bal.stats();
  EXPECT_EQ(st.total.evictions_all(), 0);
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Pool)], 1);
  EXPECT_EQ(f.keys(a).size(), 4u);
  f.bal.set_active(b, true);  // b's own pins are tier 5: never taken for a new pin
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(b, 200 + k)) << k;
  EXPECT_TRUE(f.keys(a).empty());
  EXPECT_FALSE(f.cast(b, 300));
  st = f.bal.stats();
  EXPECT_EQ(st.bypassed[static_cast<int>(Bypass::Refused)], 1);
  EXPECT_EQ(st.total.evictions_all(), 4);
}

// Note [Budget reservation]: casts on several threads, each making a pin past
// the cap by taking another model's pins, never count the same freed room
// twice. Were they to, two would be admitted for one pin's room and the pool
// would refuse one (bypassed.pool). Every new pin takes exactly one pin.
// Randomized (yields between casts): the seed is printed.
TEST(BalancerCap, ConcurrentCastsNeverCountTheSameFreedRoom) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  constexpr int kThreads = 4, kPerThread = 24, kCap = 16;
  Fixture f(kCap * U, PolicyKind::Mru);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  for (uint64_t k = 0; k < kCap; ++k) ASSERT_TRUE(f.cast(a, k)) << k;
  ASSERT_EQ(f.bal.stats().total.evictions_all(), 0);
  f.bal.mark_prompt({b});
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int i = 0; i < kPerThread; ++i) {
        if (!f.cast(b, 1000 + t * kPerThread + i)) failed++;
        if (rng() % 4 == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& th : threads) th.join();
  const BalancerStats st = f.bal.stats();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(st.bypassed_all(), 0);
  // a's sixteen, then b's own older ones (tier 4: b is in the prompt, not active)
  EXPECT_EQ(st.total.evictions_all(), kThreads * kPerThread);
  EXPECT_LE(f.pool.stats().committed_bytes.peak, static_cast<int64_t>(kCap * U));
  EXPECT_EQ(f.bal.reserved_bytes(), 0u);
  f.pool.check_invariants();
}

// No cap: the budget is RAM's alone, as before (the cap's room is not read
// into it). A cap set later binds the next pin.
TEST(BalancerCap, ACapSetLaterBindsTheNextPin) {
  Fixture f(0, PolicyKind::Mru);
  const ModelId a = f.bal.register_model("a", "cuda:0");
  const ModelId b = f.bal.register_model("b", "cuda:0");
  for (uint64_t k = 0; k < 8; ++k) ASSERT_TRUE(f.cast(a, k));
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 0);
  f.pool.set_cap(8 * U);
  f.bal.mark_prompt({b});
  ASSERT_TRUE(f.cast(b, 100));
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 1);
  EXPECT_EQ(f.keys(a), (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace pins
