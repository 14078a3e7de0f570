// The monitor's wake-ups on Windows (pressure_signal_win.cpp): stop()'s event
// and the low-memory notification (Note [Windows pressure notification]).
#include "csrc/system/pressure_signal.h"

#include <gtest/gtest.h>

#include "tests/csrc/system/monitor_fixture.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "csrc/system/monitor.h"

namespace pins {
namespace {

using namespace std::chrono_literals;
using testing::Clock;
using testing::eventually;
using testing::FakeProbe;
using Woken = PressureSignal::Woken;

TEST(PressureSignalWindows, HasTheLowMemoryNotification) {
  EXPECT_TRUE(make_pressure_signal("")->has_system_signal());
}

TEST(PressureSignalWindows, AWakeBeforeTheWaitIsKeptAndConsumedOnce) {
  auto s = make_pressure_signal("");
  s->wake();
  s->wake();
  EXPECT_EQ(s->wait(10s), Woken::kWake);
  const auto t0 = Clock::now();
  EXPECT_EQ(s->wait(20ms), Woken::kTimeout) << "memory is low on this machine, or the wake was kept";
  EXPECT_GE(Clock::now() - t0, 15ms);
}

TEST(PressureSignalWindows, AWakeEndsAWaitInProgress) {
  auto s = make_pressure_signal("");
  std::atomic<bool> woken{false};
  std::thread waiter([&] { woken = s->wait(10s) == Woken::kWake; });
  std::this_thread::sleep_for(20ms);
  const auto t0 = Clock::now();
  s->wake();
  waiter.join();
  EXPECT_TRUE(woken.load());
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(PressureSignalWindows, TheMonitorUsesItAndStillChecksEveryInterval) {
  FakeProbe probe(10 * GiB);
  std::atomic<uint64_t> calls{0};
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [&] { calls++; }, 2ms, "");
  EXPECT_TRUE(mon.uses_psi());
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 10; }));
  probe.available = 1 * GiB;
  EXPECT_TRUE(eventually([&] { return calls.load() >= 1; }));
  EXPECT_EQ(mon.foreign_wakeups(), 0u);
}

TEST(PressureSignalWindows, TheMonitorStopsPromptlyWhileWaitingOnIt) {
  FakeProbe probe(10 * GiB);
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [] {}, 10s, "");
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 1; }));
  const auto t0 = Clock::now();
  mon.stop();
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_FALSE(mon.inherited());
}

}  // namespace
}  // namespace pins
