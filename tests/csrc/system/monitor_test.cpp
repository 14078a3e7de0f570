// PressureMonitor on every system: its checks, its triggers and its stops (the
// system's signals: monitor_linux_test.cpp, pressure_signal_win_test.cpp).
#include "csrc/system/monitor.h"

#include <gtest/gtest.h>

#include "tests/csrc/system/monitor_fixture.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "csrc/base/check.h"

namespace pins {
namespace {

using namespace std::chrono_literals;
using testing::Clock;
using testing::eventually;
using testing::FakeProbe;
using testing::polling_root;

TEST(PressureMonitor, NoTriggerAboveHeadroom) {
  FakeProbe probe(10 * GiB);
  std::atomic<int> calls{0};
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [&] { calls++; }, 2ms, polling_root());
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 10; }));
  mon.stop();
  EXPECT_EQ(mon.triggers(), 0u);
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(mon.errors(), 0u);
}

TEST(PressureMonitor, TriggersBelowHeadroom) {
  FakeProbe probe(1 * GiB);
  std::atomic<uint64_t> calls{0};
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [&] { calls++; }, 2ms, polling_root());
  ASSERT_TRUE(eventually([&] { return calls.load() >= 3; }));
  mon.stop();
  EXPECT_EQ(mon.triggers(), calls.load());
  EXPECT_LE(mon.triggers(), mon.wakeups());
}

// Note [Pressure monitor wake-ups]: a check that found pressure is followed by
// another within kPressureRecheck (20 ms), not a whole interval; without pressure the
// interval stands.
TEST(PressureMonitor, ChecksAgainSoonAfterPressure) {
  FakeProbe probe(1 * GiB);
  std::atomic<uint64_t> calls{0};
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [&] { calls++; }, 10s, polling_root());
  EXPECT_TRUE(eventually([&] { return calls.load() >= 5; })) << "one check per 10 s interval, not per 20 ms";
  probe.available = 10 * GiB;  // relieved: back to the interval
  const auto quiet = [&] {
    const uint64_t w = mon.wakeups();
    std::this_thread::sleep_for(200ms);
    return mon.wakeups() - w;
  };
  quiet();  // the check after the last pressure
  EXPECT_EQ(quiet(), 0u) << "checks went on every 20 ms without pressure";
  mon.stop();
}

// Note [Pressure monitor wake-ups]: the wait after a check that found no
// pressure, from the rate at which available RAM falls.
constexpr double kGiBPerSecond = static_cast<double>(GiB);

TEST(PressureCheckWait, KeepsTheIntervalWhenAvailableRamDoesNotFall) {
  EXPECT_EQ(pressure_check_wait(5 * GiB, 4 * GiB, 0, 200ms), 200ms);
}

TEST(PressureCheckWait, KeepsTheIntervalForAFallFarFromTheHeadroom) {
  // 320 MiB a second: 3.2 s to fall the 1 GiB left.
  EXPECT_EQ(pressure_check_wait(5 * GiB, 4 * GiB, 0.3125 * kGiBPerSecond, 200ms), 200ms);
  // Far, at any rate: 1 TiB above the headroom, 1 TiB a second.
  EXPECT_EQ(pressure_check_wait(1025 * GiB, 1 * GiB, 1024 * kGiBPerSecond, 200ms), 200ms);
}

TEST(PressureCheckWait, WaitsHalfTheTimeAFallTakesToReachTheHeadroom) {
  // 512 MiB above the headroom, falling 1 GiB a second: 500 ms to reach it.
  EXPECT_EQ(pressure_check_wait(4 * GiB + 512 * MiB, 4 * GiB, kGiBPerSecond, 1s), 250ms);
  EXPECT_EQ(pressure_check_wait(4 * GiB + 512 * MiB, 4 * GiB, kGiBPerSecond, 200ms), 200ms);  // capped
  // 40 MiB above: 39 ms to reach it; never sooner than kPressureRecheck.
  EXPECT_EQ(pressure_check_wait(4 * GiB + 40 * MiB, 4 * GiB, kGiBPerSecond, 200ms), kPressureRecheck);
  EXPECT_EQ(pressure_check_wait(4 * GiB, 4 * GiB, kGiBPerSecond, 200ms), kPressureRecheck);  // at it
  // An interval shorter than kPressureRecheck stands.
  EXPECT_EQ(pressure_check_wait(4 * GiB + 1, 4 * GiB, 1024 * kGiBPerSecond, 5ms), 5ms);
}

TEST(PressureFallRate, IsTheFallSinceTheReadingBefore) {
  EXPECT_DOUBLE_EQ(pressure_fall_rate(0, 256 * MiB, 250ms, 200ms), kGiBPerSecond);
  EXPECT_DOUBLE_EQ(pressure_fall_rate(0, 0, 250ms, 200ms), 0);  // stood or rose
  EXPECT_DOUBLE_EQ(pressure_fall_rate(kGiBPerSecond, 0, 0ms, 200ms), kGiBPerSecond);  // no time between
}

// An allocator descheduled between two checks (the hog on a loaded 2-core
// machine) leaves a reading with no fall; the rate seen before still counts,
// halved for each interval since, so the next wait stays short.
TEST(PressureFallRate, ALullKeepsTheRateSeenBeforeHalvedPerInterval) {
  EXPECT_DOUBLE_EQ(pressure_fall_rate(kGiBPerSecond, 0, 200ms, 200ms), kGiBPerSecond / 2);
  EXPECT_DOUBLE_EQ(pressure_fall_rate(kGiBPerSecond, 0, 400ms, 200ms), kGiBPerSecond / 4);
  EXPECT_DOUBLE_EQ(pressure_fall_rate(kGiBPerSecond, 256 * MiB, 100ms, 200ms), 2.5 * kGiBPerSecond);  // faster now
  EXPECT_EQ(pressure_fall_rate(kGiBPerSecond, 0, 10000s, 200ms), 0);  // gone, never below 0
  // 256 MiB above the headroom after a 20 ms lull at 1 GiB a second: 250 ms
  // to reach it at the old rate, not the interval a rate of 0 would give.
  EXPECT_LT(pressure_check_wait(4 * GiB + 256 * MiB, 4 * GiB, pressure_fall_rate(kGiBPerSecond, 0, 20ms, 200ms), 200ms),
            200ms);
}

// A model of the hog check's allocator: available RAM falls at `rate` bytes a
// second from where on_pressure()'s relief left it (`give_back`), and the
// crossing of the headroom is known to the nanosecond.
class FallingProbe : public MemoryProbe {
 public:
  FallingProbe(uint64_t from, uint64_t rate) : rate_(rate) { reset(from); }
  MemoryInfo read() override {
    std::lock_guard<std::mutex> g(mu_);
    MemoryInfo m;
    m.total = 64 * GiB;
    m.available = at(Clock::now());
    return m;
  }
  void reset(uint64_t available) {
    std::lock_guard<std::mutex> g(mu_);
    from_ = available;
    since_ = Clock::now();
  }
  // When available RAM reaches `line` (or reached it: it was below at the reset).
  Clock::time_point reaches(uint64_t line) {
    std::lock_guard<std::mutex> g(mu_);
    if (from_ <= line) return since_;
    return since_ + std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(from_ - line) / rate_ * 1e9));
  }

 private:
  uint64_t at(Clock::time_point t) const {
    const double fell = std::chrono::duration<double>(t - since_).count() * static_cast<double>(rate_);
    return fell >= static_cast<double>(from_) ? 0 : from_ - static_cast<uint64_t>(fell);
  }
  const uint64_t rate_;
  std::mutex mu_;
  uint64_t from_ = 0;     // LOCK: mu_
  Clock::time_point since_;  // LOCK: mu_
};

// Note [Pressure monitor wake-ups]: with an interval of 1 s and a relief that
// leaves 512 MiB above the headroom, an allocator taking 2 GiB a second
// crosses the headroom 250 ms after each relief; a check sees it within
// kPressureRecheck (plus scheduling), not at the next interval (750 ms late:
// what this test saw before the monitor measured the fall).
TEST(PressureMonitor, ChecksBeforeAFallReachesTheHeadroom) {
  constexpr uint64_t kHeadroom = 4 * GiB;
  FallingProbe probe(kHeadroom - 1, 2 * GiB);
  std::mutex mu;
  std::vector<Clock::duration> late;  // LOCK: mu
  std::atomic<int> calls{0};
  PressureMonitor mon(
      probe, [] { return kHeadroom; },
      [&] {
        const auto now = Clock::now();
        if (calls++ > 0) {  // the first is the start's, below the headroom from the beginning
          std::lock_guard<std::mutex> g(mu);
          late.push_back(now - probe.reaches(kHeadroom));
        }
        probe.reset(kHeadroom + 512 * MiB);
      },
      1s, polling_root());
  ASSERT_TRUE(eventually([&] { return calls.load() >= 5; }));
  mon.stop();
  std::lock_guard<std::mutex> g(mu);
  for (const Clock::duration d : late) {
    EXPECT_LT(d, 200ms) << "a check came " << std::chrono::duration_cast<std::chrono::milliseconds>(d).count()
                        << " ms after available RAM fell below the headroom";
  }
}

TEST(PressureMonitor, SeesASlowFallWithoutPsi) {
  FakeProbe probe(10 * GiB);
  std::atomic<uint64_t> calls{0};
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [&] { calls++; }, 2ms, polling_root());
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 3; }));
  EXPECT_EQ(calls.load(), 0u);
  probe.available = 4 * GiB - 1;
  EXPECT_TRUE(eventually([&] { return calls.load() >= 1; }));
}

TEST(PressureMonitor, HeadroomChangesApplyToTheNextCheck) {
  FakeProbe probe(3 * GiB);
  std::atomic<uint64_t> headroom{2 * GiB};
  std::atomic<uint64_t> calls{0};
  PressureMonitor mon(probe, [&] { return headroom.load(); }, [&] { calls++; }, 2ms, polling_root());
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 5; }));
  EXPECT_EQ(calls.load(), 0u);
  headroom = 4 * GiB;
  EXPECT_TRUE(eventually([&] { return calls.load() >= 1; }));
}

TEST(PressureMonitor, StopJoinsPromptlyDespiteALongInterval) {
  FakeProbe probe(10 * GiB);
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [] {}, 10s, polling_root());
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 1; }));  // now asleep for 10 s
  const auto t0 = Clock::now();
  mon.stop();
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_EQ(mon.wakeups(), 1u);
  mon.stop();  // idempotent
  EXPECT_EQ(mon.wakeups(), 1u);
}

TEST(PressureMonitor, DestructorJoinsPromptlyDespiteALongInterval) {
  FakeProbe probe(10 * GiB);
  auto mon = std::make_unique<PressureMonitor>(probe, [] { return 4 * GiB; }, [] {}, 10s, polling_root());
  ASSERT_TRUE(eventually([&] { return mon->wakeups() >= 1; }));
  const auto t0 = Clock::now();
  mon.reset();
  EXPECT_LT(Clock::now() - t0, 1s);
  const uint64_t reads = probe.reads.load();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(probe.reads.load(), reads);  // nothing runs after destruction
}

TEST(PressureMonitor, StopFromOnPressureDoesNotDeadlock) {
  FakeProbe probe(1 * GiB);
  std::atomic<PressureMonitor*> self{nullptr};
  std::atomic<bool> stopped{false};
  auto mon = std::make_unique<PressureMonitor>(
      probe, [] { return 4 * GiB; },
      [&] {
        if (PressureMonitor* m = self.load()) {
          m->stop();
          stopped = true;
        }
      },
      1ms, polling_root());
  self = mon.get();
  ASSERT_TRUE(eventually([&] { return stopped.load(); }));
  // The thread ends after the call that stopped it.
  const uint64_t wakeups = mon->wakeups();
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(mon->wakeups(), wakeups);
  const auto t0 = Clock::now();
  mon.reset();
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(PressureMonitor, ConcurrentStopsAllReturn) {
  FakeProbe probe(10 * GiB);
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [] {}, 10s, polling_root());
  std::thread a([&] { mon.stop(); }), b([&] { mon.stop(); });
  a.join();
  b.join();
  mon.stop();
}

TEST(PressureMonitor, AFailingCheckIsCountedAndTheMonitorGoesOn) {
  FakeProbe probe(1 * GiB);
  probe.fail = true;
  std::atomic<uint64_t> calls{0};
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [&] { calls++; }, 2ms, polling_root());
  ASSERT_TRUE(eventually([&] { return mon.errors() >= 3; }));
  EXPECT_EQ(calls.load(), 0u);
  probe.fail = false;
  EXPECT_TRUE(eventually([&] { return calls.load() >= 1; }));
}

TEST(PressureMonitor, RejectsANonPositiveInterval) {
  FakeProbe probe(1 * GiB);
  EXPECT_THROW(PressureMonitor(probe, [] { return 4 * GiB; }, [] {}, 0ms, polling_root()), ValueError);
}

}  // namespace
}  // namespace pins
