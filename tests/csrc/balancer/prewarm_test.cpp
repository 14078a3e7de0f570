// Note [Prewarm] (csrc/balancer/prewarm.h): what the balancer commits ahead of
// a prompt, within what budget, what gives it back, and the thread that runs
// the steps without a cast ever waiting for it.
#include "csrc/balancer/prewarm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "csrc/balancer/budget.h"
#include "csrc/base/size.h"
#include "csrc/pool/backend.h"
#include "tests/csrc/pool/pool_fixture.h"

namespace pins {
namespace {

using testing::pool_opts;

constexpr uint64_t U = 64 * MiB;  // one pin
constexpr size_t kStep = 8 * MiB;

// RAM as the balancer sees it: a fixed amount free before pins, less what the
// pool has committed (read every time).
class Probe : public MemoryProbe {
 public:
  Probe(HostPool& pool, uint64_t free_before_pins) : free_(free_before_pins), pool_(pool) {}
  MemoryInfo read() override {
    MemoryInfo m;
    m.total = 64 * GiB;
    const uint64_t used = pool_.committed_bytes();
    m.available = free_.load() > used ? free_.load() - used : 0;
    return m;
  }
  int64_t max_age_ns() const override { return 0; }
  std::atomic<uint64_t> free_;

 private:
  HostPool& pool_;
};

// The null backend, with the commits of exactly `held_size` bytes held at a
// gate while the test wants: the prewarm's steps, and no pin of these tests.
class SlowBackend final : public HostBackend {
 public:
  SlowBackend() : inner_(make_null_backend()) {}
  const char* name() const override { return "slow"; }
  size_t page_size() const override { return inner_->page_size(); }
  bool can_lock() const override { return false; }
  int reserve(size_t size, void** p) override { return inner_->reserve(size, p); }
  int release(void* p, size_t size) override { return inner_->release(p, size); }
  int commit(void* p, size_t size) override {
    if (size == held_size && hold) {
      held = true;
      while (hold) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return inner_->commit(p, size);
  }
  int decommit(void* p, size_t size) override { return inner_->decommit(p, size); }
  int lock(void*, size_t) override { return -1; }
  int unlock(void*, size_t) override { return -1; }
  std::atomic<bool> hold{false}, held{false};
  size_t held_size = kStep;

 private:
  std::unique_ptr<HostBackend> inner_;
};

Config config() {
  Config c;
  c.headroom = 4 * GiB;  // the prewarm's line: max(4 GiB, max(2 GiB, 2 GiB))
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
  // `spare`: bytes of RAM available above the headroom before any pin.
  explicit Fixture(uint64_t spare, Config c = config(), std::unique_ptr<HostBackend> backend = make_null_backend())
      : pool(std::move(backend), pool_opts()), probe(pool, 4 * GiB + spare), bal(c, pool, probe) {}
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
  // Steps until one commits nothing; returns the bytes committed.
  size_t prewarm() {
    size_t total = 0;
    while (size_t got = bal.prewarm_step(kStep)) total += got;
    return total;
  }
  HostPool pool;
  Probe probe;
  Balancer bal;
};

TEST(PrewarmBudget, RoomIsAvailableLessReservationsAboveTheHigherLine) {
  Config c = config();
  EXPECT_EQ(prewarm_room(4 * GiB + 3 * U, 0, c), 3 * U);
  EXPECT_EQ(prewarm_room(4 * GiB + 3 * U, U, c), 2 * U) << "pins being made come first";
  EXPECT_EQ(prewarm_room(4 * GiB, 0, c), 0u);
  EXPECT_EQ(prewarm_room(1 * GiB, 2 * GiB, c), 0u);
  c.pin_reserve = 6 * GiB;  // the pin's line above the headroom: that one
  EXPECT_EQ(prewarm_room(6 * GiB + U, 0, c), U);
}

// A model is expected to pin its registered size before its first prompt,
// then what it held at most in its last prompt; only models marked in the
// prompt or active count.
TEST(PrewarmSizing, TheSizeFirstThenTheLastPromptsPeakLessWhatIsHeld) {
  Fixture f(/*spare=*/64 * U);
  ModelOptions o;
  o.size = 10 * U;
  const ModelId a = f.bal.register_model("a", "cpu", o);
  const ModelId b = f.bal.register_model("b", "cpu");  // size unknown
  EXPECT_EQ(f.bal.prewarm_want(), 0u) << "no prompt yet";
  f.bal.mark_prompt({a, b});
  EXPECT_EQ(f.bal.prewarm_want(), 10 * U);
  for (uint64_t k = 0; k < 6; ++k) ASSERT_TRUE(f.cast(a, k));
  EXPECT_EQ(f.bal.prewarm_want(), 4 * U);
  ASSERT_TRUE(f.cast(b, 100));
  EXPECT_EQ(f.bal.prewarm_want(), 4 * U) << "b has no size and no prompt behind it";
  EXPECT_EQ(f.bal.free(2 * U), 2 * U);  // evicts b's pin and one of a's
  f.bal.end_prompt();
  EXPECT_EQ(f.bal.prewarm_want(), 0u) << "outside a prompt nothing is expected";
  f.bal.set_active(b, true);  // active without a prompt counts
  EXPECT_EQ(f.bal.prewarm_want(), 1 * U) << "b held one pin at most";
  f.bal.set_active(b, false);
  f.bal.mark_prompt({a});
  EXPECT_EQ(f.bal.prewarm_want(), 1 * U) << "a held 6 pins at most, holds 5";
  f.bal.end_prompt();
  // A model that pinned nothing in its prompt is expected to pin nothing next.
  const ModelId c = f.bal.register_model("c", "cpu", o);
  f.bal.mark_prompt({c});
  EXPECT_EQ(f.bal.prewarm_want(), 10 * U);
  f.bal.end_prompt();
  f.bal.mark_prompt({c});
  EXPECT_EQ(f.bal.prewarm_want(), 0u);
}

TEST(PrewarmStep, CommitsWhatIsWantedLessIdleMemoryAndThePinsUseIt) {
  Fixture f(/*spare=*/64 * U);
  ModelOptions o;
  o.size = 4 * U;
  const ModelId m = f.bal.register_model("m", "cpu", o);
  EXPECT_EQ(f.bal.prewarm_step(kStep), 0u) << "not in a prompt";
  f.bal.mark_prompt({m});
  EXPECT_EQ(f.prewarm(), 4 * U);
  PoolStats s = f.pool.stats();
  EXPECT_EQ(s.prewarmed_bytes.current, static_cast<int64_t>(4 * U));
  EXPECT_EQ(s.prewarms, static_cast<int64_t>(4 * U / kStep));
  EXPECT_EQ(f.pool.retain_free(), 64 * U) << "the retain limit holds it (available above the headroom)";
  EXPECT_EQ(f.prewarm(), 0u) << "idle memory covers what is wanted";
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(f.cast(m, k));
  s = f.pool.stats();
  EXPECT_EQ(s.commits, 0) << "every pin found its pages committed";
  EXPECT_EQ(s.prewarm_served, 4);
  EXPECT_EQ(s.prewarmed_bytes.current, 0);
  EXPECT_EQ(f.bal.prewarm_want(), 0u);
}

// A pin being made has its memory (its bytes reserved): a cast committing its
// own pages beside a round leaves nothing for the round to commit for it.
TEST(PrewarmStep, APinBeingMadeCountsAsHeld) {
  auto backend = std::make_unique<SlowBackend>();
  SlowBackend& be = *backend;
  be.held_size = U;  // the pin's commit, not the steps
  Fixture f(/*spare=*/64 * U, config(), std::move(backend));
  ModelOptions o;
  o.size = U;
  const ModelId m = f.bal.register_model("m", "cpu", o);
  f.bal.mark_prompt({m});
  be.hold = true;
  std::thread cast([&] { EXPECT_TRUE(f.cast(m, 1)); });
  for (int i = 0; i < 5000 && !be.held; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(be.held);
  EXPECT_EQ(f.bal.reserved_bytes(), U);
  EXPECT_EQ(f.bal.prewarm_step(kStep), 0u);
  be.hold = false;
  cast.join();
  EXPECT_EQ(f.bal.prewarm_step(kStep), 0u) << "held now";
  EXPECT_EQ(f.pool.stats().prewarms, 0);
}

TEST(PrewarmStep, NeverPastTheBudgetOrTheCapAndOffWhenConfiguredOff) {
  Fixture f(/*spare=*/3 * U);
  ModelOptions o;
  o.size = 10 * U;
  const ModelId m = f.bal.register_model("m", "cpu", o);
  f.bal.mark_prompt({m});
  EXPECT_EQ(f.prewarm(), 3 * U) << "up to the headroom, not the 10U wanted";
  EXPECT_GE(f.probe.read().available, 4 * GiB);

  Config c = config();
  c.prewarm = false;
  Fixture off(/*spare=*/64 * U, c);
  const ModelId n = off.bal.register_model("n", "cpu", o);
  off.bal.mark_prompt({n});
  EXPECT_EQ(off.bal.prewarm_want(), 10 * U);
  EXPECT_EQ(off.prewarm(), 0u);

  Fixture capped(/*spare=*/64 * U);
  capped.pool.set_cap(2 * U);
  const ModelId k = capped.bal.register_model("k", "cpu", o);
  capped.bal.mark_prompt({k});
  EXPECT_EQ(capped.prewarm(), 2 * U);
  EXPECT_LE(capped.pool.committed_bytes(), 2 * U);
}

// Note [Cap budget]: under the pool's cap the prewarm commits up to the cap and
// no further, and what it committed is a new pin's room there as idle memory
// is: b's first two pins take it and evict nothing; its third takes one of a's
// pins (tier 1), the cap never passed.
TEST(PrewarmBudget, UnderACapPrewarmedMemoryIsRoomAndTheTiersFreeTheRest) {
  Fixture f(/*spare=*/64 * U);
  f.pool.set_cap(4 * U);
  const ModelId a = f.bal.register_model("a", "cpu");
  ModelOptions o;
  o.size = 4 * U;
  const ModelId b = f.bal.register_model("b", "cpu", o);
  for (uint64_t k = 0; k < 2; ++k) ASSERT_TRUE(f.cast(a, k));
  f.bal.mark_prompt({b});
  EXPECT_EQ(f.prewarm(), 2 * U) << "up to the cap, not the 4U wanted";
  EXPECT_EQ(f.pool.committed_bytes(), 4 * U);
  for (uint64_t k = 10; k < 12; ++k) ASSERT_TRUE(f.cast(b, k));
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 0);
  EXPECT_EQ(f.pool.stats().prewarm_served_bytes, static_cast<int64_t>(2 * U));
  ASSERT_TRUE(f.cast(b, 12));
  EXPECT_EQ(f.bal.stats().total.evictions_all(), 1);
  EXPECT_EQ(f.bal.stats().bypassed_all(), 0);
  EXPECT_LE(f.pool.stats().committed_bytes.peak, static_cast<int64_t>(4 * U));
}

// Under RAM pressure prewarmed memory goes back as idle memory does: before any
// pin, and the steps stop.
TEST(PrewarmPressure, RelieveGivesItBackBeforeAnyPinAndTheStepsStop) {
  Fixture f(/*spare=*/16 * U);
  ModelOptions o;
  o.size = 10 * U;
  const ModelId m = f.bal.register_model("m", "cpu", o);
  f.bal.mark_prompt({m});
  for (uint64_t k = 0; k < 2; ++k) ASSERT_TRUE(f.cast(m, k));
  EXPECT_EQ(f.prewarm(), 8 * U);
  EXPECT_EQ(f.pool.idle_bytes(), 8 * U);
  f.probe.free_ = 4 * GiB + 6 * U;  // something else took 10U: available 4 GiB + 6U - 10U
  EXPECT_EQ(f.bal.relieve(), 0u) << "no pin evicted";
  EXPECT_EQ(f.pool.idle_bytes(), 4 * U) << "idle memory down to the headroom";
  EXPECT_EQ(f.bal.pins().size(), 2u);
  EXPECT_EQ(f.prewarm(), 0u) << "no room above the line";
  f.probe.free_ = 4 * GiB;  // more pressure: all idle memory goes, then pins
  f.bal.relieve();
  EXPECT_EQ(f.pool.idle_bytes(), 0u);
  EXPECT_EQ(f.pool.stats().prewarmed_bytes.current, 0);
}

TEST(Prewarmer, ARoundRunsTheStepsOnItsThreadAndStopEndsIt) {
  Fixture f(/*spare=*/64 * U);
  ModelOptions o;
  o.size = 4 * U;
  const ModelId m = f.bal.register_model("m", "cpu", o);
  f.bal.mark_prompt({m});
  Prewarmer p(f.bal, kStep);
  EXPECT_FALSE(p.inherited());
  p.wake();
  for (int i = 0; i < 5000 && (p.busy() || p.committed() < 4 * U); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(p.busy());
  EXPECT_EQ(p.committed(), 4 * U);
  EXPECT_EQ(p.rounds(), 1u);
  EXPECT_EQ(p.errors(), 0u);
  EXPECT_EQ(f.pool.stats().prewarmed_bytes.current, static_cast<int64_t>(4 * U));
  p.stop();
  p.stop();  // idempotent
  p.wake();  // after stop: nothing
  EXPECT_FALSE(p.busy());
}

// Note [Prewarm]: a cast never waits for the prewarm. Its step is held inside
// the backend's commit; meanwhile a new pin (its own commit), a hit, the
// prompt boundaries, relieve() and the stats all go on, and stop() ends the
// round once the step returns.
TEST(Prewarmer, ACastNeverWaitsForAStepInFlight) {
  auto backend = std::make_unique<SlowBackend>();
  SlowBackend& be = *backend;
  Fixture f(/*spare=*/64 * U, config(), std::move(backend));
  ModelOptions o;
  o.size = 8 * U;
  const ModelId m = f.bal.register_model("m", "cpu", o);
  be.hold = true;
  f.bal.mark_prompt({m});
  Prewarmer p(f.bal, kStep);
  p.wake();
  for (int i = 0; i < 5000 && !be.held; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(be.held) << "the step did not start";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(f.cast(m, 1));  // a miss: no prewarmed extent yet, it commits its own
  ASSERT_TRUE(f.cast(m, 1));  // a hit
  f.bal.set_active(m, true);
  f.bal.end_node();
  f.bal.relieve();
  (void)f.bal.stats();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(p.busy()) << "the step is still held";
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(f.pool.stats().commits, 1) << "the cast committed its own pages";
  EXPECT_EQ(f.bal.stats().total.hits, 1);
  std::thread stopper([&] { p.stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  be.hold = false;  // the step returns; stop() ends the round there
  stopper.join();
  EXPECT_FALSE(p.busy());
  EXPECT_EQ(p.committed(), kStep) << "one step, then stopped";
}

}  // namespace
}  // namespace pins
