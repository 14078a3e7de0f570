// The runtime on every system: its configuration, its monitor, its one
// process-wide instance (across fork(): runtime_linux_test.cpp).
#include "csrc/runtime/runtime.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "csrc/balancer/balancer.h"
#include "csrc/base/check.h"
#include "csrc/base/size.h"
#include "tests/csrc/config/env.h"
#include "tests/csrc/runtime/runtime_fixture.h"

namespace pins {
namespace {

using testing::eventually;
using testing::RuntimeTest;

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
#if !defined(_WIN32)  // Windows reads its memory from the system, not from a system root
  EXPECT_EQ(rt.probe().read().available, 62914560ull * KiB);
#endif
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

#if !defined(_WIN32)  // Windows reads its memory from the system, not from a system root
// Note [Derived budget]: the process's configuration takes headroom and
// pin_reserve from the machine (here the fixture's 64 GiB of MemTotal) unless
// PINS_CONF sets them, and says where every value came from.
TEST_F(RuntimeTest, ProcessConfigDerivesTheBudgetFromTheMachine) {
  const std::string base = "backend:null,system_root:" + root_.path();
  SourcedConfig s = process_config(base.c_str());
  EXPECT_EQ(s.config.headroom, 4 * GiB);
  EXPECT_EQ(s.config.pin_reserve, 2 * GiB);
  ASSERT_TRUE(s.derived.has_value());
  EXPECT_EQ(s.derived->basis_bytes, 64 * GiB);
  EXPECT_EQ(s.sources.at("headroom"), ConfigSource::Machine);
  EXPECT_EQ(s.sources.at("backend"), ConfigSource::Env);
  EXPECT_EQ(s.sources.at("policy"), ConfigSource::Default);
  EXPECT_TRUE(s.config.monitor);

  root_.write("proc/meminfo", "MemTotal: 16318928 kB\nMemAvailable: 12000000 kB\n");  // a "16 GB" machine
  s = process_config(base.c_str());
  EXPECT_EQ(s.config.headroom, 1 * GiB);
  EXPECT_EQ(s.config.pin_reserve, 512 * MiB);
  s = process_config((base + ",headroom:3GiB").c_str());
  EXPECT_EQ(s.config.headroom, 3 * GiB);
  EXPECT_EQ(s.sources.at("headroom"), ConfigSource::Env);
  EXPECT_EQ(s.config.pin_reserve, 512 * MiB);
  EXPECT_EQ(s.sources.at("pin_reserve"), ConfigSource::Machine);
  EXPECT_THROW(process_config((base + ",headroom:lots").c_str()), ValueError);

  // No meminfo to read: Config's fixed defaults, and they say so.
  testing::FixtureRoot empty;
  s = process_config(("backend:null,system_root:" + empty.path()).c_str());
  EXPECT_FALSE(s.derived.has_value());
  EXPECT_EQ(s.config.headroom, 4 * GiB);
  EXPECT_EQ(s.sources.at("headroom"), ConfigSource::Default);
}

TEST_F(RuntimeTest, ProcessConfigTakesACgroupLimitBelowRam) {
  root_.write("proc/self/cgroup", "0::/job\n");
  root_.write("sys/fs/cgroup/job/memory.max", std::to_string(6 * GiB) + "\n");
  root_.write("sys/fs/cgroup/job/memory.current", std::to_string(1 * GiB) + "\n");
  const SourcedConfig s = process_config(("backend:null,system_root:" + root_.path()).c_str());
  EXPECT_EQ(s.config.headroom, 1 * GiB);
  ASSERT_TRUE(s.derived.has_value());
  EXPECT_EQ(s.derived->basis, BudgetBasis::CgroupLimit);
  EXPECT_EQ(describe_source(s.sources.at("headroom"), s.derived), "derived from the machine: cgroup limit 6.00 GiB");
}
#endif

TEST_F(RuntimeTest, ConfigSourcesFollowConfigure) {
  Runtime rt(sourced_config("backend:null,segment_size:64MiB,extent_min:1MiB,monitor:false,system_root:" +
                                root_.path(),
                            derive_budget(32 * GiB, 0)));
  const auto source_of = [&](const std::string& key) {
    for (const auto& [k, s] : rt.config_sources())
      if (k == key) return s;
    return std::string("missing");
  };
  EXPECT_EQ(rt.config_sources().size(), config_keys().size());
  EXPECT_EQ(rt.config().headroom, 2 * GiB);
  EXPECT_EQ(source_of("headroom"), "derived from the machine: RAM 32.00 GiB");
  EXPECT_EQ(source_of("monitor"), "PINS_CONF");
  EXPECT_EQ(source_of("policy"), "default");
  rt.configure("policy:trace,HEADROOM:1G");
  EXPECT_EQ(source_of("headroom"), "configure()");
  EXPECT_EQ(source_of("policy"), "configure()");
  EXPECT_EQ(source_of("pin_reserve"), "derived from the machine: RAM 32.00 GiB");
  EXPECT_THROW(rt.configure("cap:1M,policy:nope"), ValueError);
  EXPECT_EQ(source_of("cap"), "default") << "a refused configure changed a source";
  Runtime plain(config());
  EXPECT_EQ(plain.config_sources().front().second, "given");
}

// The monitor runs unless the configuration turns it off (Config's default).
TEST_F(RuntimeTest, TheMonitorIsOnByDefault) {
  Runtime rt(parse_config("backend:null,segment_size:64MiB,extent_min:1MiB,system_root:" + root_.path()));
  EXPECT_TRUE(rt.monitor_running());
  EXPECT_TRUE(eventually([&] { return rt.monitor_status().wakeups >= 1; }));
#if !defined(_WIN32)
  EXPECT_EQ(rt.monitor_status().triggers, 0u) << "the fixture has plenty of RAM available";
#endif
}

#if !defined(_WIN32)  // the test moves MemAvailable through its system root
// Note [Pressure from others]: pins that take available RAM into their slack
// inside a node (below the headroom, above the pin reserve line) are not
// pressure to the monitor; another process's allocation on top of them is.
// With the headroom as the monitor's line, the first phase relieved the pins.
TEST_F(RuntimeTest, TheMonitorLeavesPinsOwnSlackAndRelievesOthersPressure) {
  const auto set_available = [&](uint64_t bytes) {
    root_.write("proc/meminfo", "MemTotal: 16777216 kB\nMemAvailable: " + std::to_string(bytes / KiB) +
                                    " kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n");
  };
  const uint64_t before_pins = 1 * GiB + 256 * MiB;
  set_available(before_pins);
  Runtime rt(config("cap:2GiB,monitor:true,monitor_interval_ms:5,memory_max_age_us:0,headroom:1GiB,"
                    "pin_reserve:512MiB,pin_slack:0,relieve_slack:0,prewarm:false,policy:mru"));
  Balancer& b = rt.balancer();
  const ModelId m = b.register_model("m", "cuda:0");
  b.relieve();  // a node boundary, no pressure
  for (uint64_t i = 0; i < 10; ++i) {  // 640 MiB: available RAM 640 MiB, below the 1 GiB headroom
    Request r;
    r.model = m;
    r.key = PinKey{i + 1, 0, 64 * MiB};
    r.bytes = 64 * MiB;
    Lease l = b.acquire(r);
    ASSERT_TRUE(l && l.needs_fill()) << "pin " << i;
    l.filled();
    set_available(before_pins - rt.pool().committed_bytes());  // what the system would say
  }
  ASSERT_EQ(b.stats().total.bytes, static_cast<int64_t>(640 * MiB));
  EXPECT_LT(rt.probe().read().available, 1 * GiB);
  const uint64_t woken = rt.monitor_status().wakeups;
  ASSERT_TRUE(eventually([&] { return rt.monitor_status().wakeups >= woken + 5; }));
  EXPECT_EQ(rt.monitor_status().triggers, 0u) << "pins' own slack taken for pressure";
  EXPECT_EQ(b.stats().total.bytes, static_cast<int64_t>(640 * MiB));
  EXPECT_EQ(b.stats().pressure_freed_bytes, 0);
  // Another process takes 256 MiB: available RAM 384 MiB, below what pins left.
  set_available(before_pins - 640 * MiB - 256 * MiB);
  EXPECT_TRUE(eventually([&] { return b.stats().pressure_freed_bytes == static_cast<int64_t>(640 * MiB); }))
      << "the monitor did not relieve: " << b.stats().pressure_freed_bytes;
  EXPECT_GE(rt.monitor_status().triggers, 1u);
  EXPECT_EQ(b.stats().total.bytes, 0);
}
#endif

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

// Note [Prewarm]: the Prewarmer runs by default, commits for a model in the
// prompt when woken, stops and restarts with the key.
TEST_F(RuntimeTest, PrewarmRunsByDefaultAndFollowsTheKey) {
  Runtime rt(config("cap:64MiB"));
  EXPECT_TRUE(rt.config().prewarm);
  ASSERT_TRUE(rt.prewarm_status().running);
  ModelOptions o;
  o.size = 16 * MiB;
  const ModelId m = rt.balancer().register_model("m", "cpu", o);
  rt.wake_prewarm();  // not in a prompt: nothing
  ASSERT_TRUE(testing::eventually([&] { return !rt.prewarm_status().busy; }));
  EXPECT_EQ(rt.pool().stats().prewarms, 0);
  rt.balancer().mark_prompt({m});
  rt.wake_prewarm();
  ASSERT_TRUE(testing::eventually([&] { return rt.prewarm_status().committed == 16 * MiB; }));
  EXPECT_EQ(rt.pool().stats().prewarmed_bytes.current, static_cast<int64_t>(16 * MiB));
  rt.configure("prewarm:false");
  EXPECT_FALSE(rt.prewarm_status().running);
  rt.wake_prewarm();  // none to wake
  rt.configure("headroom:2GiB");  // no prewarm change: none started
  EXPECT_FALSE(rt.prewarm_status().running);
  rt.configure("prewarm:true");
  EXPECT_TRUE(rt.prewarm_status().running);
  EXPECT_EQ(rt.prewarm_status().committed, 0u) << "a new Prewarmer";
  Runtime off(config("prewarm:false"));
  EXPECT_FALSE(off.prewarm_status().running);
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
                     ",monitor_interval_ms:" + std::to_string(1 + (i * 7 + t) % 9) +
                     ",prewarm:" + ((i + t) % 3 == 0 ? "false" : "true"));
        rt.wake_prewarm();
        EXPECT_NO_THROW(rt.config());
        (void)rt.monitor_running();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(rt.monitor_running(), rt.config().monitor);
  EXPECT_EQ(rt.prewarm_status().running, rt.config().prewarm);
  rt.configure("monitor:true");
  EXPECT_TRUE(rt.monitor_running());
  rt.configure("monitor:false");
  EXPECT_FALSE(rt.monitor_running());
}

// The process-wide instance in a fresh process (it lives for the whole process,
// so the parent may have built it already): a bad PINS_CONF throws and the next
// call tries again; once built, PINS_CONF is not read again.
[[noreturn]] void get_twice_then_exit() {
  const auto fail = [](const char* why) {
    std::fprintf(stderr, "runtime-get-failed: %s\n", why);
    std::_Exit(1);
  };
  testing::set_env("PINS_CONF", "backend:floppy");
  try {
    Runtime::get();
    fail("a bad PINS_CONF was accepted");
  } catch (const ValueError& e) {
    if (std::string(e.what()).find("floppy") == std::string::npos) fail(e.what());
  }
  testing::set_env("PINS_CONF", "backend:null");
  Runtime& rt = Runtime::get();
  if (std::string(rt.pool().stats().backend) != "null") fail("the retry did not use the new PINS_CONF");
  testing::set_env("PINS_CONF", "backend:cpu");
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
