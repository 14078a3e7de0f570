// PressureMonitor on every system: its checks, its triggers and its stops (the
// system's signals: monitor_linux_test.cpp, pressure_signal_win_test.cpp).
#include "csrc/system/monitor.h"

#include <gtest/gtest.h>

#include "tests/csrc/system/monitor_fixture.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

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
// another within kRecheck (20 ms), not a whole interval; without pressure the
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
