#include "csrc/pool/pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "csrc/base/check.h"

namespace pins {
namespace {

PoolOptions opts(size_t extent_min = 1 * MiB, size_t cap = 0, size_t retain = 64 * MiB) {
  PoolOptions o;
  o.segment_size = 64 * MiB;
  o.extent_min = extent_min;
  o.alignment = 512;
  o.cap = cap;
  o.retain_free = retain;
  return o;
}

uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

class FakeFence : public Fence {
 public:
  explicit FakeFence(std::atomic<bool>* flag) : flag_(flag) {}
  bool done() override { return flag_->load(); }
  void wait() override {
    while (!flag_->load()) std::this_thread::yield();
  }

 private:
  std::atomic<bool>* flag_;
};

int64_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

TEST(HostPool, ReusesAFreedBlockWithoutNewCommit) {
  HostPool pool(make_null_backend(), opts());
  void* a = pool.allocate(300 * KiB);
  pool.free(a);
  void* b = pool.allocate(300 * KiB);
  EXPECT_EQ(a, b);
  EXPECT_EQ(pool.stats().commits, 1);
  pool.free(b);
}

TEST(HostPool, NoPowerOfTwoRounding) {
  HostPool pool(make_null_backend(), opts());
  void* p = pool.allocate(5000);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.requested_bytes.current, 5000);
  EXPECT_EQ(s.allocated_bytes.current, 5120);  // 512-byte alignment, not 8192
  EXPECT_EQ(addr(p) % 512, 0u);
  pool.free(p);
}

TEST(HostPool, LargeRequestGetsAnExactExtent) {
  HostPool pool(make_null_backend(), opts());
  const size_t n = 100 * MiB + 12345;  // larger than extent_min and segment_size
  void* p = pool.allocate(n);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>((n + 4095) / 4096 * 4096));
  EXPECT_EQ(s.segments, 1);
  pool.free(p);
}

TEST(HostPool, SplitsAndCoalesces) {
  HostPool pool(make_null_backend(), opts(1 * MiB));
  void* a = pool.allocate(256 * KiB);
  void* b = pool.allocate(256 * KiB);
  void* c = pool.allocate(256 * KiB);
  // One extent, carved in order.
  EXPECT_EQ(addr(b), addr(a) + 256 * KiB);
  EXPECT_EQ(addr(c), addr(b) + 256 * KiB);
  EXPECT_EQ(pool.stats().commits, 1);
  // Best fit: a 128 KiB request lands in b's hole, not in the 256 KiB tail.
  pool.free(b);
  void* d = pool.allocate(128 * KiB);
  EXPECT_EQ(d, b);
  // Everything freed coalesces back to one block spanning the extent.
  pool.free(a);
  pool.free(c);
  pool.free(d);
  void* whole = pool.allocate(1 * MiB);
  EXPECT_EQ(whole, a);
  EXPECT_EQ(pool.stats().commits, 1);
  pool.free(whole);
}

TEST(HostPool, CapRefusesCleanly) {
  HostPool pool(make_null_backend(), opts(1 * MiB, 4 * MiB));
  void* a = pool.allocate(3 * MiB);
  const PoolStats before = pool.stats();
  EXPECT_EQ(pool.try_allocate(2 * MiB), nullptr);
  PoolStats after = pool.stats();
  EXPECT_EQ(after.refusals, before.refusals + 1);
  EXPECT_EQ(after.committed_bytes.current, before.committed_bytes.current);
  EXPECT_EQ(after.allocated_bytes.current, before.allocated_bytes.current);
  try {
    pool.allocate(2 * MiB);
    FAIL() << "allocate past the cap did not throw";
  } catch (const ResourceError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(2 * MiB)), std::string::npos) << m;  // the request
    EXPECT_NE(m.find("cap " + std::to_string(4 * MiB)), std::string::npos) << m;
    EXPECT_NE(m.find("committed " + std::to_string(3 * MiB)), std::string::npos) << m;
  }
  // What fits under the cap still works.
  void* b = pool.allocate(1 * MiB);
  EXPECT_NE(b, nullptr);
  pool.free(a);
  pool.free(b);
}

TEST(HostPool, CapDecommitsIdleExtentsToMakeRoom) {
  HostPool pool(make_null_backend(), opts(1 * MiB, 4 * MiB, 64 * MiB));
  void* a = pool.allocate(3 * MiB);
  pool.free(a);  // idle, still committed (retain_free is large)
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(3 * MiB));
  void* b = pool.allocate(4 * MiB);  // does not fit beside it: the idle extent goes
  EXPECT_NE(b, nullptr);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>(4 * MiB));
  EXPECT_EQ(s.decommits, 1);
  pool.free(b);
}

TEST(HostPool, RetainsIdleUpToThresholdThenTrims) {
  HostPool pool(make_null_backend(), opts(1 * MiB, 0, 8 * MiB));
  void* a = pool.allocate(6 * MiB);
  void* b = pool.allocate(6 * MiB);
  pool.free(a);  // 6 MiB idle <= 8 MiB: kept
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(12 * MiB));
  pool.free(b);  // 12 MiB idle > 8 MiB: the oldest idle extent (a) goes
  PoolStats s = pool.stats();
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>(6 * MiB));
  EXPECT_EQ(pool.trim(0), 6 * MiB);
  s = pool.stats();
  EXPECT_EQ(s.committed_bytes.current, 0);
  EXPECT_EQ(s.locked_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, 0);  // the empty segment was released
}

TEST(HostPool, DecommitLowersRss) {
  HostPool pool(make_cpu_backend(false), opts(1 * MiB, 0, 0));
  const size_t n = 64 * MiB;
  const int64_t base = rss_kib();
  void* p = pool.allocate(n);
  std::memset(p, 0x5a, n);
  const int64_t held = rss_kib();
  EXPECT_GE(held - base, static_cast<int64_t>(n / KiB) * 9 / 10) << "commit did not show in RSS";
  pool.free(p);  // retain_free is 0: decommitted at once
  const int64_t after = rss_kib();
  EXPECT_LE(after - base, static_cast<int64_t>(n / KiB) / 10) << "RSS " << base << " -> " << held << " -> " << after;
  EXPECT_EQ(pool.stats().decommits, 1);
}

TEST(HostPool, StatsArithmetic) {
  HostPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  void* a = pool.allocate(1000);      // 1024 allocated
  void* b = pool.allocate(2 * MiB);   // its own 2 MiB extent
  PoolStats s = pool.stats();
  EXPECT_STREQ(s.backend, "null");
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.requested_bytes.current, 1000 + static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.allocated_bytes.current, 1024 + static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>(3 * MiB));
  EXPECT_EQ(s.locked_bytes.current, static_cast<int64_t>(3 * MiB));  // null backend "locks"
  EXPECT_EQ(s.registrations, 2);
  EXPECT_EQ(s.commits, 2);
  EXPECT_EQ(s.blocks.current, 2);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<int64_t>(64 * MiB));
  pool.free(b);
  s = pool.stats();
  EXPECT_EQ(s.frees, 1);
  EXPECT_EQ(s.allocated_bytes.current, 1024);
  EXPECT_EQ(s.allocated_bytes.peak, 1024 + static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.allocated_bytes.freed, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.blocks.peak, 2);
  pool.reset_peak();
  pool.reset_accumulated();
  s = pool.stats();
  EXPECT_EQ(s.allocated_bytes.peak, 1024);
  EXPECT_EQ(s.allocated_bytes.allocated, 0);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(s.frees, 0);
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>(3 * MiB));  // levels survive resets
  pool.free(a);
}

TEST(HostPool, UnlockedRequestsUseSeparateExtents) {
  HostPool pool(make_null_backend(), opts(1 * MiB));
  void* locked = pool.allocate(4096, true);
  void* plain = pool.allocate(4096, false);
  EXPECT_TRUE(pool.is_locked(locked));
  EXPECT_FALSE(pool.is_locked(plain));
  EXPECT_EQ(pool.stats().locked_bytes.current, static_cast<int64_t>(1 * MiB));
  pool.free(locked);
  pool.free(plain);
}

TEST(HostPool, FencedBlockIsNotReusedUntilDone) {
  HostPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  std::atomic<bool> done{false};
  void* a = pool.allocate(64 * KiB);
  pool.record_fence(a, std::make_shared<FakeFence>(&done));
  EXPECT_TRUE(pool.in_flight(a));
  pool.free(a);
  EXPECT_EQ(pool.stats().deferred_frees, 1);
  void* b = pool.allocate(64 * KiB);
  EXPECT_NE(b, a) << "a block with a copy in flight was handed out again";
  pool.free(b);
  EXPECT_EQ(pool.trim(0), 0u) << "the extent of a parked block was decommitted";
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(1 * MiB));
  done = true;
  void* c = pool.allocate(64 * KiB);
  EXPECT_EQ(c, a) << "once the fence is done the block is reusable";
  pool.free(c);
  EXPECT_EQ(pool.trim(0), 1 * MiB);
}

TEST(HostPool, CompletedFencesArePrunedOnRecord) {
  HostPool pool(make_null_backend(), opts());
  std::atomic<bool> done{true};
  std::atomic<bool> pending{false};
  void* a = pool.allocate(4096);
  for (int i = 0; i < 100; ++i) pool.record_fence(a, std::make_shared<FakeFence>(&done));
  EXPECT_FALSE(pool.in_flight(a));
  pool.record_fence(a, std::make_shared<FakeFence>(&pending));
  EXPECT_TRUE(pool.in_flight(a));
  pending = true;
  EXPECT_FALSE(pool.in_flight(a));
  pool.free(a);
  EXPECT_EQ(pool.stats().deferred_frees, 1);  // a fence was listed at free time
}

TEST(HostPool, BadPointersAndSizesAreErrors) {
  HostPool pool(make_null_backend(), opts());
  int x = 0;
  EXPECT_THROW(pool.free(&x), ValueError);
  void* a = pool.allocate(4096);
  pool.free(a);
  EXPECT_THROW(pool.free(a), ValueError);  // double free
  EXPECT_THROW(pool.try_allocate(0), ValueError);
  EXPECT_THROW(pool.record_fence(a, nullptr), ValueError);
  EXPECT_EQ(pool.stats().frees, 1);
}

TEST(HostPool, EightThreadsKeepTheirContents) {
  HostPool pool(make_cpu_backend(false), opts(1 * MiB, 0, 16 * MiB));
  const unsigned seed = std::random_device{}();
  std::printf("HostPool.EightThreadsKeepTheirContents seed=%u\n", seed);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      std::uniform_int_distribution<size_t> size(1, 3 * MiB);
      std::vector<std::pair<unsigned char*, size_t>> live;
      for (int i = 0; i < 400; ++i) {
        if (live.size() < 6 && (live.empty() || rng() % 2)) {
          const size_t n = size(rng) >> (rng() % 8);
          auto* p = static_cast<unsigned char*>(pool.allocate(n == 0 ? 1 : n));
          const size_t len = n == 0 ? 1 : n;
          std::memset(p, (t * 31 + static_cast<int>(len)) & 0xff, len);
          live.emplace_back(p, len);
        } else {
          const size_t k = rng() % live.size();
          auto [p, n] = live[k];
          const unsigned char want = (t * 31 + static_cast<int>(n)) & 0xff;
          for (size_t j = 0; j < n; j += 509)
            if (p[j] != want) errors++;
          if (p[n - 1] != want) errors++;
          pool.free(p);
          live.erase(live.begin() + static_cast<long>(k));
        }
      }
      for (auto [p, n] : live) pool.free(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.blocks.current, 0);
  EXPECT_EQ(s.allocations, s.frees);
  EXPECT_LE(s.committed_bytes.current, static_cast<int64_t>(16 * MiB + 3 * MiB));
}

TEST(HostPool, MlockBackendLocksPages) {
  HostPool pool(make_cpu_backend(true), opts(1 * MiB, 0, 0));
  void* p = pool.try_allocate(256 * KiB);
  if (p == nullptr) GTEST_SKIP() << "mlock refused here (RLIMIT_MEMLOCK); cannot test the mlock path";
  EXPECT_TRUE(pool.is_locked(p));
  EXPECT_EQ(pool.stats().locked_bytes.current, static_cast<int64_t>(1 * MiB));
  pool.free(p);
  EXPECT_EQ(pool.stats().locked_bytes.current, 0);
  EXPECT_EQ(pool.stats().unregistrations, 1);
}

TEST(HostPool, CudaBackendRegistersHostMemory) {
  auto backend = make_cuda_backend();
  if (!backend) GTEST_SKIP() << "no CUDA device (or pins built without CUDA): cudaHostRegister path not testable";
  HostPool pool(std::move(backend), opts(1 * MiB, 0, 0));
  EXPECT_STREQ(pool.stats().backend, "cuda");
  void* p = pool.allocate(3 * MiB);
  EXPECT_TRUE(pool.is_locked(p));
  std::memset(p, 1, 3 * MiB);
  EXPECT_EQ(pool.stats().registrations, 1);
  EXPECT_GT(pool.stats().lock_ns, 0);
  pool.free(p);
  EXPECT_EQ(pool.stats().unregistrations, 1);
}

TEST(HostPool, AutoBackendFallsBackToCpu) {
  auto b = make_backend(BackendKind::Auto, false);
  if (make_cuda_backend()) {
    EXPECT_STREQ(b->name(), "cuda");
  } else {
    EXPECT_STREQ(b->name(), "cpu");
    EXPECT_THROW(make_backend(BackendKind::Cuda, false), ValueError);
  }
}

}  // namespace
}  // namespace pins

namespace pins {
namespace {

TEST(HostPoolUnlock, DropsTheExtentLockAndKeepsTheMemory) {
  HostPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  void* a = pool.allocate(64 * KiB);
  void* b = pool.allocate(64 * KiB);  // same extent
  EXPECT_EQ(pool.unlock(a), 1 * MiB);
  EXPECT_FALSE(pool.is_locked(a));
  EXPECT_FALSE(pool.is_locked(b)) << "the whole extent is unlocked";
  PoolStats s = pool.stats();
  EXPECT_EQ(s.locked_bytes.current, 0);
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>(1 * MiB));
  EXPECT_EQ(pool.unlock(a), 0u) << "already unlocked";
  // Its free space now serves unlocked requests only; a locked request commits anew.
  void* c = pool.allocate(64 * KiB, true);
  EXPECT_TRUE(pool.is_locked(c));
  EXPECT_EQ(pool.stats().commits, 2);
  void* d = pool.allocate(64 * KiB, false);
  EXPECT_EQ(addr(d), addr(b) + 64 * KiB);
  for (void* p : {a, b, c, d}) pool.free(p);
}

TEST(HostPoolUnlock, RefusesWhileACopyIsInFlight) {
  HostPool pool(make_null_backend(), opts(1 * MiB));
  std::atomic<bool> done{false};
  void* a = pool.allocate(64 * KiB);
  void* b = pool.allocate(64 * KiB);
  pool.record_fence(b, std::make_shared<FakeFence>(&done));
  EXPECT_EQ(pool.unlock(a), 0u) << "a neighbour's DMA would lose its registration";
  EXPECT_TRUE(pool.is_locked(a));
  done = true;
  EXPECT_EQ(pool.unlock(a), 1 * MiB);
  pool.free(a);
  pool.free(b);
}

}  // namespace
}  // namespace pins
