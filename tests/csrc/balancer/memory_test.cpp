// Note [Memory readings] and Note [Warm idle memory] (csrc/balancer/budget_gate.h):
// how often the balancer reads system memory, and what it keeps committed after
// an eviction.
#include <gtest/gtest.h>

#include <atomic>

#include "csrc/balancer/balancer.h"
#include "csrc/base/size.h"
#include "csrc/pool/backend.h"
#include "tests/csrc/pool/pool_fixture.h"

namespace pins {
namespace {

using testing::pool_opts;

constexpr uint64_t U = 64 * MiB;  // one pin

// RAM as the balancer sees it: a fixed amount free before pins, minus what the
// pool has committed; counts its reads, and may be reused for `max_age_ns`.
class CountingProbe : public MemoryProbe {
 public:
  CountingProbe(HostPool& pool, uint64_t free_before_pins, int64_t max_age_ns)
      : free_(free_before_pins), pool_(pool), max_age_ns_(max_age_ns) {}
  MemoryInfo read() override {
    reads++;
    MemoryInfo m;
    m.total = 64 * GiB;
    const uint64_t used = pool_.committed_bytes();
    m.available = free_.load() > used ? free_.load() - used : 0;
    return m;
  }
  int64_t max_age_ns() const override { return max_age_ns_; }
  std::atomic<uint64_t> free_;
  int reads = 0;

 private:
  HostPool& pool_;
  int64_t max_age_ns_;
};

Config config() {
  Config c;
  c.headroom = 4 * GiB;  // a new pin needs 2 GiB + its size available
  c.pin_reserve = 2 * GiB;
  c.pin_slack = 0;
  c.relieve_slack = 0;
  c.ceiling_min = 0;
  c.ceiling_max = 1;
  c.ceiling_reserve = 0;
  c.ceiling_swap_reserve = 0;
  return c;
}

struct Fixture {
  Fixture(uint64_t room_pins, int64_t max_age_ns, Config c = config(), uint64_t reserve = 2 * GiB)
      : pool(make_null_backend(), pool_opts()), probe(pool, reserve + room_pins * U, max_age_ns), bal(c, pool, probe) {
    model = bal.register_model("m", "cuda:0");
  }
  bool cast(uint64_t key, uint64_t bytes = U) {
    Request r;
    r.model = model;
    r.key = PinKey{key, 0, bytes};
    r.bytes = bytes;
    Lease l = bal.acquire(r);
    if (!l) return false;
    if (l.needs_fill()) l.filled();
    return true;
  }
  HostPool pool;
  CountingProbe probe;
  Balancer bal;
  ModelId model = -1;
};

TEST(BalancerMemoryReadings, AModelOfMemoryIsReadOnEveryMiss) {
  Fixture f(/*room_pins=*/100, /*max_age_ns=*/0);
  for (uint64_t k = 0; k < 10; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_GE(f.probe.reads, 10);
}

TEST(BalancerMemoryReadings, TheSystemIsReadOnceAndTheReadingMovesWithThePoolsCommits) {
  Fixture f(/*room_pins=*/4, /*max_age_ns=*/int64_t{3600} * 1000000000);
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_EQ(f.probe.reads, 1) << "misses in budget reuse the reading";
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(k));  // hits read nothing
  EXPECT_EQ(f.probe.reads, 1);
  // The fifth pin does not fit by the reading less the 4 pins committed since:
  // read afresh before anything is evicted, then one pin makes room.
  ASSERT_TRUE(f.cast(4));
  EXPECT_EQ(f.probe.reads, 2);
  EXPECT_EQ(f.bal.pins().size(), 4u);
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 1);
}

TEST(BalancerWarmMemory, AnEvictedPinsMemoryStaysCommittedForTheNextPin) {
  Fixture f(/*room_pins=*/2, /*max_age_ns=*/0);
  ASSERT_TRUE(f.cast(0));
  ASSERT_TRUE(f.cast(1));
  const PoolStats before = f.pool.stats();
  for (uint64_t k = 2; k < 6; ++k) ASSERT_TRUE(f.cast(k));  // each evicts one and reuses its memory
  const PoolStats after = f.pool.stats();
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 4);
  EXPECT_EQ(after.commits, before.commits) << "no fresh pages for the new pins";
  EXPECT_EQ(after.decommits, before.decommits);
  EXPECT_EQ(f.pool.committed_bytes(), 2 * U);
}

TEST(BalancerWarmMemory, FreeKeepsAboveTheHeadroomAndRelieveGivesIdleMemoryBackFirst) {
  Fixture f(/*room_pins=*/38, /*max_age_ns=*/0);  // 2 GiB + 38U = 4 GiB + 6U free before pins
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_EQ(f.bal.relieve(), 0u);  // a boundary above the headroom (Note [Pressure from others])
  // Evicting two pins keeps their memory: available (4 GiB + 2U) stays above the headroom (4 GiB).
  EXPECT_EQ(f.bal.free(2 * U), 2 * U);
  EXPECT_EQ(f.pool.idle_bytes(), 2 * U);
  EXPECT_EQ(f.pool.committed_bytes(), 4 * U);
  // RAM pressure: idle memory goes back first, then pins, until available is the headroom.
  f.probe.free_ = 4 * GiB + U;  // available = 4 GiB + U - 4U: short of the headroom by 3U
  const size_t freed = f.bal.relieve();
  EXPECT_EQ(f.pool.idle_bytes(), 0u) << "idle memory went back first";
  EXPECT_EQ(freed, U) << "then one pin";
  EXPECT_EQ(f.bal.pins().size(), 1u);
  EXPECT_EQ(f.pool.committed_bytes(), U);
}

// Under RAM pressure relieve() gives the system its slack, idle memory first:
// kept warm in the pool, it would leave available RAM at the headroom, and any
// allocation elsewhere would take it below again before the next check (the
// hog check, docs/RELIABILITY.md "Memory pressure from another process").
TEST(BalancerWarmMemory, RelieveGivesTheSlackBackToTheSystem) {
  Config c = config();
  c.relieve_slack = 2 * U;
  Fixture f(/*room_pins=*/38, /*max_age_ns=*/0, c);  // 2 GiB + 38U = 4 GiB + 6U free before pins
  for (uint64_t k = 0; k < 6; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_EQ(f.bal.relieve(), 0u);  // a boundary at the headroom (Note [Pressure from others])
  EXPECT_EQ(f.bal.free(U), U);  // available 4 GiB + U: above the headroom, kept warm
  EXPECT_EQ(f.pool.idle_bytes(), U);
  // Short of the headroom by U: the idle pin's worth goes back, and so do
  // enough pins for the slack too (available = 4 GiB + 2U), none of it kept idle.
  f.probe.free_ = 4 * GiB + 5 * U;  // available = 4 GiB + 5U - 6U
  EXPECT_EQ(f.bal.relieve(), 2 * U);
  EXPECT_EQ(f.pool.idle_bytes(), 0u) << "the slack stayed in the pool";
  EXPECT_EQ(f.probe.read().available, 4 * GiB + 2 * U);
  // At the headroom or above, nothing moves, and idle memory stays warm.
  EXPECT_EQ(f.bal.free(U), U);
  EXPECT_EQ(f.bal.relieve(), 0u);
  EXPECT_EQ(f.pool.idle_bytes(), U);
}

// Note [Pressure from others]: what pins alone took below the headroom (down
// to the pin reserve line, as admission allows) stays through a boundary's
// relieve(); another process's allocation on top of it brings available RAM
// back to headroom + relieve_slack.
TEST(BalancerWarmMemory, ABoundaryKeepsWhatPinsAloneTookBelowTheHeadroom) {
  Config c = config();
  c.relieve_slack = U;
  Fixture f(/*room_pins=*/40, /*max_age_ns=*/0, c);  // 2 GiB + 40U = 4 GiB + 8U free before pins
  EXPECT_EQ(f.bal.relieve(), 0u);
  for (uint64_t k = 0; k < 12; ++k) ASSERT_TRUE(f.cast(k));
  ASSERT_EQ(f.probe.read().available, 4 * GiB - 4 * U) << "pins took 4U of the headroom";
  EXPECT_EQ(f.bal.relieve(), 0u) << "pins' own slack is no pressure";
  EXPECT_EQ(f.bal.pins().size(), 12u);
  EXPECT_EQ(f.bal.relieve(), 0u) << "nor at the next boundary";
  f.probe.free_ -= U;  // another process takes U
  EXPECT_EQ(f.bal.relieve(), 6 * U) << "back to headroom + relieve_slack";
  EXPECT_EQ(f.bal.pins().size(), 6u);
  EXPECT_EQ(f.probe.read().available, 4 * GiB + U);
}

// A new budget (configure()) measures what pins hold against its own headroom:
// what they took as their slack under the former one is not theirs under it.
TEST(BalancerWarmMemory, ANewHeadroomTakesBackThePinsSlack) {
  Config c = config();
  c.relieve_slack = U;
  Fixture f(/*room_pins=*/40, /*max_age_ns=*/0, c);  // 4 GiB + 8U free before pins
  EXPECT_EQ(f.bal.relieve(), 0u);
  for (uint64_t k = 0; k < 12; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_EQ(f.bal.relieve(), 0u) << "available 4 GiB - 4U: pins' own slack";
  c.headroom = 4 * GiB + 2 * U;
  f.bal.configure(c);
  EXPECT_EQ(f.bal.relieve(), 7 * U) << "to the new headroom + relieve_slack";
  EXPECT_EQ(f.probe.read().available, 4 * GiB + 3 * U);
}

TEST(BalancerWarmMemory, BelowTheHeadroomFreeGivesTheMemoryBack) {
  Fixture f(/*room_pins=*/4, /*max_age_ns=*/0);  // available 2 GiB once the 4 pins exist
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_EQ(f.bal.free(2 * U), 2 * U);
  EXPECT_EQ(f.pool.idle_bytes(), 0u) << "idle memory never holds available RAM below the headroom";
  EXPECT_EQ(f.pool.committed_bytes(), 2 * U);
}

// A new pin the walk freed for and could not make is copied from its source
// through the page cache: what the walk freed is no warm memory for it, and
// idle memory holds no available RAM below the headroom (pins-sim's u24-33:
// 161 MiB kept idle left the page cache one layer short of the two streamed
// layers the loop was refused, read from disk at every step).
TEST(BalancerWarmMemory, ARefusedPinLeavesNoIdleMemoryBelowTheHeadroom) {
  Fixture f(/*room_pins=*/4, /*max_age_ns=*/0);  // available 2 GiB once 4 pins exist
  const ModelId other = f.bal.register_model("other", "cuda:0");
  ASSERT_TRUE(f.cast(0));  // the fixture's model: not in the prompt, tier 1
  f.model = other;
  f.bal.set_active(other, true);
  for (uint64_t k = 1; k < 4; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_FALSE(f.cast(10, 2 * U)) << "the active model's own pins are spared: U freed of 2U";
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 1);
  EXPECT_EQ(f.pool.idle_bytes(), 0u) << "the freed pin's memory went back";
  EXPECT_EQ(f.pool.committed_bytes(), 3 * U);
  ASSERT_TRUE(f.cast(11));  // a pin that fits still reuses nothing stale and commits its own
  EXPECT_EQ(f.bal.pins().size(), 4u);
}

// With headroom:0 and pin_reserve:0 the line is 0: a pin larger than any idle
// extent commits fresh memory while the idle extents it was counted on stay
// committed. A reading of no available RAM gives them back, so the pool never
// stays past the RAM it was given (it did: 6U committed of 4U).
TEST(BalancerWarmMemory, WithNoHeadroomIdleMemoryGoesBackWhenNothingIsAvailable) {
  Config c = config();
  c.headroom = 0;
  c.pin_reserve = 0;
  Fixture f(/*room_pins=*/4, /*max_age_ns=*/0, c, /*reserve=*/0);
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(k));
  EXPECT_EQ(f.pool.committed_bytes(), 4 * U);
  ASSERT_TRUE(f.cast(10, 2 * U));  // evicts two pins of U for one of 2U
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 2);
  EXPECT_LE(f.pool.committed_bytes(), 4 * U) << "idle " << f.pool.idle_bytes();
  EXPECT_EQ(f.bal.stats().total.bytes, 4 * static_cast<int64_t>(U));
}

}  // namespace
}  // namespace pins
