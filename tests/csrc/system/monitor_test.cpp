#include "csrc/system/monitor.h"

#include <gtest/gtest.h>

#include "tests/csrc/system/fixture_root.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "csrc/base/check.h"

namespace pins {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A probe whose available RAM the test sets.
class FakeProbe : public MemoryProbe {
 public:
  explicit FakeProbe(uint64_t available) : available(available) {}
  MemoryInfo read() override {
    reads.fetch_add(1);
    if (fail.load()) throw ResourceError("fake probe failure");
    MemoryInfo m;
    m.total = 64 * GiB;
    m.available = available.load();
    return m;
  }
  std::atomic<uint64_t> available;
  std::atomic<bool> fail{false};
  std::atomic<uint64_t> reads{0};
};

// Waits up to 5 s for `cond`.
template <typename Cond>
bool eventually(Cond cond) {
  const auto deadline = Clock::now() + 5s;
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

using testing::FixtureRoot;

// A root with no proc/pressure: the monitor polls.
std::string polling_root() {
  static FixtureRoot root;
  return root.path();
}

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
