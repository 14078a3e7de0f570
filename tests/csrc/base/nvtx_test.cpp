// The NVTX ranges a profiler sees: a probe tool (nvtx_probe.cpp) is injected
// through NVTX_INJECTION64_PATH before the first range, then pool and balancer
// work runs and the probe's record is checked. Its own executable, so no other
// test starts NVTX first.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "csrc/balancer/balancer.h"

namespace pins {
namespace {

// Room for one 64 MiB pin above the 2 GiB a new pin must leave available.
class Roomless : public MemoryProbe {
 public:
  explicit Roomless(HostPool& pool) : pool_(pool) {}
  MemoryInfo read() override {
    const uint64_t used = static_cast<uint64_t>(pool_.stats().committed_bytes.current);
    return {64 * GiB, 2 * GiB + 100 * MiB - used, 0, 0, false};
  }

 private:
  HostPool& pool_;
};

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(Nvtx, RangesInThePinsDomainReachTheProfiler) {
#if !defined(PINS_NVTX)
  GTEST_SKIP() << "built without PINS_NVTX: the ranges compile to nothing";
#else
  ASSERT_EQ(setenv("NVTX_INJECTION64_PATH", PINS_NVTX_PROBE, 1), 0);
  {
    PoolOptions o;
    o.retain_free = 0;
    HostPool pool(make_null_backend(), o);
    Roomless probe(pool);
    Balancer bal(Config{}, pool, probe);
    const ModelId m = bal.register_model("m", "cuda:0");
    bal.mark_prompt({m});
    for (uint64_t k = 0; k < 3; ++k) {
      Request r;
      r.model = m;
      r.key = PinKey{k, 0, 64 * MiB};
      r.bytes = 64 * MiB;
      Lease l = bal.acquire(r);  // the second needs room: ensure_budget frees the first
      if (l) l.filled();
    }
    bal.end_prompt();
  }
  void* h = dlopen(PINS_NVTX_PROBE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr) << "NVTX did not load the probe tool";
  auto dump = reinterpret_cast<const char* (*)()>(dlsym(h, "pins_nvtx_probe_dump"));
  ASSERT_NE(dump, nullptr);
  const std::string events = dump();
  EXPECT_EQ(count(events, "domain:pins\n"), 1) << events;
  EXPECT_GE(count(events, "push:pins:pins::ensure_budget\n"), 3) << events;
  EXPECT_GE(count(events, "push:pins:pins::free\n"), 1) << events;
  EXPECT_GE(count(events, "push:pins:pins::register\n"), 1) << events;
  EXPECT_EQ(count(events, "push:pins:pins::end_prompt\n"), 1) << events;
  EXPECT_EQ(count(events, "push:pins:"), count(events, "pop:pins")) << "unbalanced ranges\n" << events;
#endif
}

}  // namespace
}  // namespace pins
