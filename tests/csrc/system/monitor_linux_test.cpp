// PressureMonitor on Linux: PSI triggers (pressure_signal_linux.cpp), and the
// monitor across fork() (Note [Monitor across fork]).
#include "csrc/system/monitor.h"

#include <gtest/gtest.h>

#include "tests/csrc/system/monitor_fixture.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace pins {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Clock;
using testing::eventually;
using testing::FakeProbe;
using testing::FixtureRoot;
using testing::polling_root;

TEST(PressureMonitor, MissingPsiFileMeansPolling) {
  FakeProbe probe(10 * GiB);
  FixtureRoot root;  // no proc/pressure/memory
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [] {}, 2ms, root.path());
  EXPECT_FALSE(mon.uses_psi());
  EXPECT_TRUE(eventually([&] { return mon.wakeups() >= 5; }));
}

TEST(PressureMonitor, NonProcfsPsiFileMeansPolling) {
  // A plain file accepts the trigger write and never signals POLLPRI: the
  // monitor must not mistake it for PSI (nor write to it).
  FakeProbe probe(10 * GiB);
  FixtureRoot root;
  const std::string psi = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
  root.write("proc/pressure/memory", psi);
  {
    PressureMonitor mon(probe, [] { return 4 * GiB; }, [] {}, 2ms, root.path());
    EXPECT_FALSE(mon.uses_psi());
    EXPECT_TRUE(eventually([&] { return mon.wakeups() >= 5; }));
  }
  EXPECT_EQ(root.read("proc/pressure/memory"), psi);
}

TEST(PressureMonitor, PsiModeStillRechecksEveryInterval) {
  FakeProbe probe(10 * GiB);
  std::atomic<uint64_t> calls{0};
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [&] { calls++; }, 2ms, "/");
  if (!mon.uses_psi()) GTEST_SKIP() << "this system refuses a PSI trigger on /proc/pressure/memory";
  // No stall is needed for checks to happen, nor for a slow fall to be seen.
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 10; }));
  probe.available = 1 * GiB;
  EXPECT_TRUE(eventually([&] { return calls.load() >= 1; }));
  EXPECT_TRUE(mon.uses_psi());
}

TEST(PressureMonitor, PsiModeStopsPromptly) {
  FakeProbe probe(10 * GiB);
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [] {}, 10s, "/");
  if (!mon.uses_psi()) GTEST_SKIP() << "this system refuses a PSI trigger on /proc/pressure/memory";
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 1; }));
  const auto t0 = Clock::now();
  mon.stop();
  EXPECT_LT(Clock::now() - t0, 1s);
}

// Note [Monitor across fork]: the child stops and destroys its copy of a
// running monitor and exits 0; the parent's monitor is not woken and goes on
// checking, with its PSI trigger (when this system grants one) intact.
void fork_child_stops_inherited_monitor(const std::string& root) {
  FakeProbe probe(10 * GiB);
  auto mon = std::make_unique<PressureMonitor>(probe, [] { return 4 * GiB; }, [] {}, 2ms, root);
  const bool psi = mon->uses_psi();
  ASSERT_TRUE(eventually([&] { return mon->wakeups() >= 2; }));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(10);
    if (!mon->inherited()) std::_Exit(2);
    const uint64_t w = mon->wakeups();
    std::this_thread::sleep_for(20ms);
    if (mon->wakeups() != w) std::_Exit(3);  // no thread checks in the child
    mon->stop();
    mon->stop();
    mon.reset();  // closes the child's copies of the descriptors
    std::_Exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_FALSE(mon->inherited());
  const uint64_t w = mon->wakeups();
  EXPECT_TRUE(eventually([&] { return mon->wakeups() >= w + 5; })) << "the parent's monitor stopped";
  EXPECT_EQ(mon->foreign_wakeups(), 0u) << "the child woke the parent's monitor";
  EXPECT_EQ(mon->uses_psi(), psi);
  const auto t0 = Clock::now();
  mon.reset();  // the parent's stop and join
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(PressureMonitor, ForkChildStopsItsCopyWithoutTouchingTheParents) {
  fork_child_stops_inherited_monitor(polling_root());
}

TEST(PressureMonitor, ForkChildLeavesTheParentsPsiTrigger) {
  FakeProbe probe(10 * GiB);
  if (!PressureMonitor(probe, [] { return 4 * GiB; }, [] {}, 1s, "/").uses_psi())
    GTEST_SKIP() << "this system refuses a PSI trigger on /proc/pressure/memory";
  fork_child_stops_inherited_monitor("/");
}

// The eventfd descriptors of this process (the monitor's wake-up descriptor).
std::vector<int> eventfds() {
  std::vector<int> fds;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(e.path(), ec);
    if (!ec && target.string() == "anon_inode:[eventfd]") fds.push_back(std::stoi(e.path().filename().string()));
  }
  return fds;
}

// A write to the eventfd that stop() did not make (as a fork child built
// before Note [Monitor across fork] made one) is drained and ignored.
TEST(PressureMonitor, AForeignWakeUpDoesNotStopIt) {
  FakeProbe probe(10 * GiB);
  const std::vector<int> before = eventfds();
  PressureMonitor mon(probe, [] { return 4 * GiB; }, [] {}, 2ms, polling_root());
  std::vector<int> mine;
  for (int fd : eventfds())
    if (std::find(before.begin(), before.end(), fd) == before.end()) mine.push_back(fd);
  ASSERT_EQ(mine.size(), 1u) << "the monitor's eventfd not found in /proc/self/fd";
  ASSERT_TRUE(eventually([&] { return mon.wakeups() >= 2; }));
  const uint64_t one = 1;
  ASSERT_EQ(::write(mine[0], &one, sizeof one), static_cast<ssize_t>(sizeof one));
  ASSERT_TRUE(eventually([&] { return mon.foreign_wakeups() == 1; }));
  const uint64_t w = mon.wakeups();
  EXPECT_TRUE(eventually([&] { return mon.wakeups() >= w + 5; })) << "a foreign write stopped the monitor";
  mon.stop();
}

}  // namespace
}  // namespace pins
