#include "csrc/pool/pool.h"

#include <gtest/gtest.h>

#if defined(_WIN32)
#include <windows.h>
#include <psapi.h>
#else
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <utility>
#include <random>
#include <string>
#include <thread>

#include "csrc/base/check.h"
#include "csrc/base/size.h"
#include "tests/csrc/pool/pool_fixture.h"

namespace pins {
namespace {

using testing::FakeFence;

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

// Note [Adopted blocks]: pages mapped as the owner of a shared segment maps
// them (MAP_SHARED; anonymous here, the pool never sees a file), VirtualAlloc
// on Windows. unmap() is what an owner's release does.
class Mapping {
 public:
  explicit Mapping(size_t size) : size_(size) {
#if defined(_WIN32)
    data_ = VirtualAlloc(nullptr, size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
#else
    data_ = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (data_ == MAP_FAILED) data_ = nullptr;
#endif
    if (data_ == nullptr) throw std::runtime_error("Mapping: the OS refused " + std::to_string(size) + " bytes");
  }
  ~Mapping() { unmap(); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void unmap() {
    if (data_ == nullptr) return;
#if defined(_WIN32)
    VirtualFree(data_, 0, MEM_RELEASE);
#else
    munmap(data_, size_);
#endif
    data_ = nullptr;
    unmaps++;
  }
  void* data() const { return data_; }
  char* at(size_t off) const { return static_cast<char*>(data_) + off; }
  size_t size() const { return size_; }
  std::atomic<int> unmaps{0};

 private:
  void* data_ = nullptr;
  size_t size_;
};

// A HostPool whose invariants (Note [Host pool invariants]) are checked after
// every call that may change it, whether the call returns or throws. Under
// several threads each check sees the others' calls half done.
class CheckedPool {
 public:
  CheckedPool(std::unique_ptr<HostBackend> backend, PoolOptions options) : pool_(std::move(backend), options) {
    check();
  }
  void* try_allocate(size_t size, bool lock = true) {
    Checker c{*this};
    return pool_.try_allocate(size, lock);
  }
  void* allocate(size_t size, bool lock = true) {
    Checker c{*this};
    return pool_.allocate(size, lock);
  }
  void free(void* ptr) {
    Checker c{*this};
    pool_.free(ptr);
  }
  void* adopt(void* data, size_t size, bool lock, std::function<void()> release) {
    Checker c{*this};
    return pool_.adopt(data, size, lock, std::move(release));
  }
  void record_fence(void* ptr, std::shared_ptr<Fence> fence) {
    Checker c{*this};
    pool_.record_fence(ptr, std::move(fence));
  }
  bool in_flight(void* ptr) { return pool_.in_flight(ptr); }
  bool begin_copy(void* ptr) {
    Checker c{*this};
    return pool_.begin_copy(ptr);
  }
  void end_copy(void* ptr, std::shared_ptr<Fence> fence = nullptr) {
    Checker c{*this};
    pool_.end_copy(ptr, std::move(fence));
  }
  size_t trim(size_t keep_idle = 0) {
    Checker c{*this};
    return pool_.trim(keep_idle);
  }
  size_t prewarm(size_t bytes) {
    Checker c{*this};
    return pool_.prewarm(bytes);
  }
  void set_retain_free(size_t bytes) {
    Checker c{*this};
    pool_.set_retain_free(bytes);
  }
  size_t idle_bytes() const { return pool_.idle_bytes(); }
  size_t unlock(void* ptr) {
    Checker c{*this};
    return pool_.unlock(ptr);
  }
  void set_cap(size_t cap) {
    Checker c{*this};
    pool_.set_cap(cap);
  }
  void reset_accumulated() {
    Checker c{*this};
    pool_.reset_accumulated();
  }
  void reset_peak() {
    Checker c{*this};
    pool_.reset_peak();
  }
  size_t requested_size(void* ptr) const { return pool_.requested_size(ptr); }
  bool is_locked(void* ptr) const { return pool_.is_locked(ptr); }
  size_t cap() const { return pool_.cap(); }
  PoolStats stats() const { return pool_.stats(); }
  PoolSnapshot snapshot() const { return pool_.snapshot(); }
  void check() const { EXPECT_NO_THROW(pool_.check_invariants()); }

 private:
  struct Checker {
    const CheckedPool& p;
    ~Checker() { p.check(); }
  };
  HostPool pool_;
};

// The process's resident memory: VmRSS on Linux, the working set on Windows.
int64_t rss_kib() {
#if defined(_WIN32)
  PROCESS_MEMORY_COUNTERS pmc{};
  if (!K32GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc)) return -1;
  return static_cast<int64_t>(pmc.WorkingSetSize / 1024);
#else
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
#endif
}

TEST(HostPool, ReusesAFreedBlockWithoutNewCommit) {
  CheckedPool pool(make_null_backend(), opts());
  void* a = pool.allocate(300 * KiB);
  pool.free(a);
  void* b = pool.allocate(300 * KiB);
  EXPECT_EQ(a, b);
  EXPECT_EQ(pool.stats().commits, 1);
  pool.free(b);
}

// Note [Idle extents are not cut]: a smaller request takes an extent of its
// own, and the idle one stays whole for a request of its size.
TEST(HostPool, AnIdleExtentIsNotCutForASmallerRequest) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  void* a = pool.allocate(8 * MiB);
  pool.free(a);  // idle, kept (retain_free is large)
  void* b = pool.allocate(3 * MiB);
  EXPECT_NE(addr(b), addr(a));
  EXPECT_EQ(pool.idle_bytes(), 8 * MiB);
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(11 * MiB));
  void* c = pool.allocate(8 * MiB);  // the idle extent, whole: nothing stranded
  EXPECT_EQ(c, a);
  EXPECT_EQ(pool.stats().commits, 2);
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(11 * MiB));
  pool.free(b);
  pool.free(c);
}

// Note [Idle extents are not cut]: nor does a small request cut an idle extent
// smaller than the extent_min it would commit (an exact extent of a request
// of more than half extent_min), which the request it was made for then finds
// whole when it comes again: the pool's warm pass commits nothing.
TEST(HostPool, AnIdleExtentIsReusedOnlyByARequestOfItsSize) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  void* a = pool.allocate(768 * KiB);  // more than half extent_min: an extent of its own
  pool.free(a);
  void* b = pool.allocate(4 * KiB);  // small: an extent_min extent, not a's
  EXPECT_NE(addr(b), addr(a));
  EXPECT_EQ(pool.idle_bytes(), 768 * KiB);
  void* c = pool.allocate(768 * KiB);
  EXPECT_EQ(c, a);
  EXPECT_EQ(pool.stats().commits, 2);
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(768 * KiB + 1 * MiB));
  pool.free(b);
  pool.free(c);
}

// Note [Idle extents are not cut]: a request of its own extent leaves the
// page-rounding tail of that extent free, and no other request takes it: a
// small pin there would hold the large extent in use after the large pin is
// freed, where a larger request then takes part of it and strands the rest
// (pins-sim's u29-7: 310 MiB of a 648 MiB extent behind a 337 MiB layer).
TEST(HostPool, ASmallRequestTakesNoTailOfALargeExtent) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  void* big = pool.allocate(3 * MiB + 100);  // an exact extent of 3 MiB + a page; its tail is free
  void* small = pool.allocate(1 * KiB);      // an extent_min extent of its own, not big's tail
  EXPECT_EQ(pool.stats().commits, 2);
  pool.free(big);
  EXPECT_EQ(pool.idle_bytes(), 3 * MiB + 4 * KiB);  // big's extent is idle: the retain limit and trim() see it
  void* mid = pool.allocate(2 * MiB);  // its own extent: big's idle one is not cut
  EXPECT_NE(addr(mid), addr(big));
  pool.trim(0);
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(1 * MiB + 2 * MiB));
  pool.free(small);
  pool.free(mid);
}

TEST(HostPool, NoPowerOfTwoRounding) {
  CheckedPool pool(make_null_backend(), opts());
  void* p = pool.allocate(5000);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.requested_bytes.current, 5000);
  EXPECT_EQ(s.allocated_bytes.current, 5120);  // 512-byte alignment, not 8192
  EXPECT_EQ(addr(p) % 512, 0u);
  pool.free(p);
}

TEST(HostPool, LargeRequestGetsAnExactExtent) {
  CheckedPool pool(make_null_backend(), opts());
  const size_t n = 100 * MiB + 12345;  // larger than extent_min and segment_size
  void* p = pool.allocate(n);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>((n + 4095) / 4096 * 4096));
  EXPECT_EQ(s.segments, 1);
  pool.free(p);
}

TEST(HostPool, SplitsAndCoalesces) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB));
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
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 4 * MiB));
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
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 4 * MiB, 64 * MiB));
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
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 8 * MiB));
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
  CheckedPool pool(make_cpu_backend(false), opts(1 * MiB, 0, 0));
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
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
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
  CheckedPool pool(make_null_backend(), opts(1 * MiB));
  void* locked = pool.allocate(4096, true);
  void* plain = pool.allocate(4096, false);
  EXPECT_TRUE(pool.is_locked(locked));
  EXPECT_FALSE(pool.is_locked(plain));
  EXPECT_EQ(pool.stats().locked_bytes.current, static_cast<int64_t>(1 * MiB));
  pool.free(locked);
  pool.free(plain);
}

TEST(HostPool, FencedBlockIsNotReusedUntilDone) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
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
  CheckedPool pool(make_null_backend(), opts());
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
  CheckedPool pool(make_null_backend(), opts());
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
  CheckedPool pool(make_cpu_backend(false), opts(1 * MiB, 0, 16 * MiB));
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
  CheckedPool pool(make_cpu_backend(true), opts(1 * MiB, 0, 0));
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
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 0));
  EXPECT_STREQ(pool.stats().backend, "cuda");
  void* p = pool.allocate(3 * MiB);
  EXPECT_TRUE(pool.is_locked(p));
  std::memset(p, 1, 3 * MiB);
  EXPECT_EQ(pool.stats().registrations, 1);
  EXPECT_GT(pool.stats().lock_ns, 0);
  pool.free(p);
  EXPECT_EQ(pool.stats().unregistrations, 1);
}

TEST(HostPool, HipBackendRegistersHostMemory) {
  auto backend = make_hip_backend();
  if (!backend) GTEST_SKIP() << "no HIP device (or pins built without HIP): hipHostRegister path not testable";
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 0));
  EXPECT_STREQ(pool.stats().backend, "hip");
  void* p = pool.allocate(3 * MiB);
  EXPECT_TRUE(pool.is_locked(p));
  std::memset(p, 1, 3 * MiB);
  EXPECT_EQ(pool.stats().registrations, 1);
  pool.free(p);
  EXPECT_EQ(pool.stats().unregistrations, 1);
}

}  // namespace
}  // namespace pins

namespace pins {
namespace {

TEST(HostPoolUnlock, DropsTheExtentLockAndKeepsTheMemory) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
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
  CheckedPool pool(make_null_backend(), opts(1 * MiB));
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

namespace pins {
namespace {

// Every call of the pool, in random order, on small extents and a moving cap;
// CheckedPool checks the invariants after each.
TEST(HostPoolInvariants, HoldAcrossRandomCalls) {
  // Note [Adopted blocks]: slots of a shared mapping, adopted among the pool's own blocks.
  constexpr size_t kSlot = 64 * KiB;
  Mapping shared(64 * kSlot);
  std::vector<bool> slot_used(64, false);
  int adoptions = 0, releases = 0;
  CheckedPool pool(make_null_backend(), opts(256 * KiB, 0, 1 * MiB));
  const unsigned seed = std::random_device{}();
  std::printf("HostPoolInvariants.HoldAcrossRandomCalls seed=%u\n", seed);
  std::mt19937 rng(seed);
  std::vector<std::shared_ptr<std::atomic<bool>>> flags;
  std::vector<void*> live;
  std::vector<void*> copying;  // begun copies (their blocks may have been freed since)
  for (int i = 0; i < 3000; ++i) {
    switch (rng() % 11) {
      case 0:
      case 1:
      case 2: {
        const size_t n = 1 + (rng() % (600 * KiB)) / (1u << (rng() % 6));
        if (void* p = pool.try_allocate(n, rng() % 4 != 0)) live.push_back(p);
        break;
      }
      case 3:
      case 4:
        if (!live.empty()) {
          const size_t k = rng() % live.size();
          pool.free(live[k]);
          live.erase(live.begin() + static_cast<long>(k));
        }
        break;
      case 5:
        if (!live.empty()) {
          flags.push_back(std::make_shared<std::atomic<bool>>(false));
          pool.record_fence(live[rng() % live.size()], std::make_shared<FakeFence>(flags.back().get()));
        }
        break;
      case 6:
        if (!live.empty()) pool.unlock(live[rng() % live.size()]);
        break;
      case 7:
        if (!flags.empty()) *flags[rng() % flags.size()] = true;  // a copy completes
        if (rng() % 4 == 0) pool.trim(rng() % 2 ? 0 : 512 * KiB);
        if (rng() % 8 == 0) pool.set_cap(rng() % 2 ? 0 : 4 * MiB);
        if (rng() % 3 == 0) pool.prewarm(1 + rng() % (2 * MiB));  // Note [Host pool layout]: cut by the allocations
        break;
      case 8:
        if (!live.empty()) {
          void* p = live[rng() % live.size()];
          if (pool.begin_copy(p)) copying.push_back(p);
        }
        break;
      case 9:
        if (!copying.empty()) {
          const size_t k = rng() % copying.size();
          std::shared_ptr<Fence> fence;
          if (rng() % 2) {
            flags.push_back(std::make_shared<std::atomic<bool>>(false));
            fence = std::make_shared<FakeFence>(flags.back().get());
          }
          pool.end_copy(copying[k], fence);
          copying.erase(copying.begin() + static_cast<long>(k));
        }
        break;
      case 10: {
        const size_t k = rng() % slot_used.size();
        if (slot_used[k]) break;
        slot_used[k] = true;
        adoptions++;
        live.push_back(pool.adopt(shared.at(k * kSlot), 4 * KiB * (1 + rng() % 16), rng() % 4 != 0, [&, k] {
          EXPECT_TRUE(slot_used[k]) << "released twice";
          slot_used[k] = false;
          releases++;
        }));
        break;
      }
    }
  }
  for (void* p : copying) pool.end_copy(p);
  for (auto& f : flags) *f = true;
  for (void* p : live) pool.free(p);
  pool.trim(0);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.blocks.current, 0);
  EXPECT_EQ(s.committed_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, 0);
  EXPECT_EQ(releases, adoptions);
  EXPECT_EQ(s.adopted_blocks.current, 0);
  EXPECT_EQ(s.adopted_blocks.freed, adoptions);
  EXPECT_EQ(s.locked_bytes.current, 0);
}

// A pool with allocated, free, parked, idle and unlocked parts, and a snapshot
// of it.
class BusyPool : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = pool_.allocate(64 * KiB);
    void* b = pool_.allocate(100 * KiB);
    void* c = pool_.allocate(3 * KiB);
    big_ = pool_.allocate(2 * MiB);         // an extent of its own
    plain_ = pool_.allocate(4 * KiB, false);  // an unlocked extent
    void* idle = pool_.allocate(3 * MiB);
    pool_.free(idle);  // an idle extent
    ASSERT_EQ(pool_.prewarm(2 * MiB), 2 * MiB);  // a prewarmed one (Note [Host pool layout])
    pool_.free(b);     // a hole between a and c
    pool_.record_fence(c, std::make_shared<FakeFence>(&pending_));
    pool_.free(c);  // parked
    ASSERT_TRUE(pool_.begin_copy(a_));  // a copy being issued (Note [Copies from a block])
    // Note [Adopted blocks]: one live and locked, one parked and unlocked.
    adopted_ = pool_.adopt(shared_.data(), 32 * KiB, true, [this] { released_++; });
    void* gone = pool_.adopt(shared_.at(32 * KiB), 32 * KiB, false, [this] { released_++; });
    pool_.record_fence(gone, std::make_shared<FakeFence>(&pending_));
    pool_.free(gone);
    good_ = pool_.snapshot();
  }
  void TearDown() override {
    pool_.end_copy(a_);
    pending_ = true;
    for (void* p : {a_, big_, plain_, adopted_}) pool_.free(p);
    pool_.trim(0);
    pool_.check_invariants();
    EXPECT_EQ(pool_.stats().committed_bytes.current, 0);
    EXPECT_EQ(released_, 2);
  }

  Mapping shared_{64 * KiB};  // outlives pool_, which may release into it
  int released_ = 0;
  std::atomic<bool> pending_{false};
  HostPool pool_{make_null_backend(), opts(1 * MiB, 0, 64 * MiB)};
  void* a_ = nullptr;
  void* big_ = nullptr;
  void* plain_ = nullptr;
  void* adopted_ = nullptr;
  PoolSnapshot good_;
};

// The lowest block in `state` of the pool's own memory (an adopted block may
// lie below the pool's segments: on Windows the test's mapping does).
const PoolSnapshot::Block& first(const PoolSnapshot& s, BlockState state) {
  const auto adopted = [&](uintptr_t extent) {
    return std::any_of(s.adopted.begin(), s.adopted.end(), [&](const auto& e) { return e.base == extent; });
  };
  for (const auto& b : s.blocks)
    if (b.state == state && !adopted(b.extent)) return b;
  throw std::logic_error("no such block in the snapshot");
}

size_t index_of(const PoolSnapshot& s, uintptr_t addr) {
  for (size_t i = 0; i < s.blocks.size(); ++i)
    if (s.blocks[i].addr == addr) return i;
  throw std::logic_error("no such block in the snapshot");
}

TEST_F(BusyPool, SnapshotPasses) {
  EXPECT_NO_THROW(check_snapshot(good_));
  EXPECT_EQ(good_.stats.copies.current, 1);
  EXPECT_EQ(good_.blocks[index_of(good_, addr(a_))].copies, 1);
  EXPECT_NO_THROW(pool_.check_invariants());
  EXPECT_EQ(good_.parked.size(), 2u);  // an own block and an adopted one
  EXPECT_EQ(good_.idle.size(), 2u);
  EXPECT_EQ(good_.extents.size(), 5u);
  ASSERT_EQ(good_.adopted.size(), 2u);
  EXPECT_TRUE(good_.adopted[0].locked);
  EXPECT_EQ(good_.stats.adopted_bytes.current, static_cast<int64_t>(64 * KiB));
  EXPECT_EQ(good_.stats.prewarmed_bytes.current, static_cast<int64_t>(2 * MiB));
  EXPECT_FALSE(good_.free[0].empty());
  EXPECT_FALSE(good_.free[1].empty());
}

// Each corruption of a consistent snapshot is caught, and the message names it.
TEST_F(BusyPool, EachCorruptionIsCaught) {
  const PoolSnapshot& good = good_;
  ASSERT_NO_THROW(check_snapshot(good));
  const PoolSnapshot::Block alloc = first(good, BlockState::Allocated);
  const PoolSnapshot::Block hole = first(good, BlockState::Free);
  struct Case {
    const char* name;
    std::function<void(PoolSnapshot&)> corrupt;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a block grows over its neighbour", [&](PoolSnapshot& s) { s.blocks[index_of(s, alloc.addr)].size += 512; },
       "do not tile"},
      {"a block's next skips a block",
       [&](PoolSnapshot& s) {
         auto& b = s.blocks[index_of(s, alloc.addr)];
         b.next = s.blocks[index_of(s, b.next)].next;
       },
       "do not tile"},
      {"a block is lost from the map",
       [&](PoolSnapshot& s) { s.blocks.erase(s.blocks.begin() + static_cast<long>(index_of(s, hole.addr))); },
       "not a block"},
      {"a free block is missing from its free set", [&](PoolSnapshot& s) { s.free[1].erase(s.free[1].begin()); },
       "is missing free block"},
      {"an allocated block is listed free",
       [&](PoolSnapshot& s) { s.free[1].push_back({alloc.size, alloc.addr}); }, "free set lists"},
      {"a free block sits in the other lock state's set",
       [&](PoolSnapshot& s) {
         s.free[0].push_back(s.free[1].front());
         s.free[1].erase(s.free[1].begin());
       },
       "free set"},
      {"two free neighbours did not coalesce",
       [&](PoolSnapshot& s) {
         auto& b = s.blocks[index_of(s, alloc.addr)];
         b.state = BlockState::Free;
         s.stats.copies.current -= b.copies;
         b.copies = 0;
         s.free[1].push_back({b.size, b.addr});
         s.stats.allocated_bytes.current -= static_cast<int64_t>(b.size);
         s.stats.requested_bytes.current -= static_cast<int64_t>(b.requested);
         s.stats.blocks.current -= 1;
         for (auto& e : s.extents)
           if (e.base == b.extent) e.used--;
       },
       "did not coalesce"},
      {"allocated_bytes drifts", [](PoolSnapshot& s) { s.stats.allocated_bytes.current += 512; }, "allocated_bytes"},
      {"requested_bytes drifts", [](PoolSnapshot& s) { s.stats.requested_bytes.current -= 1; }, "requested_bytes"},
      {"the live block count drifts", [](PoolSnapshot& s) { s.stats.blocks.current += 1; }, "blocks is"},
      {"committed_bytes drifts", [](PoolSnapshot& s) { s.stats.committed_bytes.current += 4096; },
       "committed_bytes"},
      {"locked_bytes counts an unlocked extent",
       [](PoolSnapshot& s) { s.stats.locked_bytes.current += 1 * MiB; }, "locked_bytes"},
      {"reserved_bytes drifts", [](PoolSnapshot& s) { s.stats.reserved_bytes.current -= 4096; }, "reserved_bytes"},
      {"an extent miscounts its blocks in use", [](PoolSnapshot& s) { s.extents.front().used += 1; },
       "blocks in use"},
      {"the idle set forgets an idle extent", [](PoolSnapshot& s) { s.idle.clear(); }, "idle set"},
      {"idle_bytes drifts", [](PoolSnapshot& s) { s.idle_bytes += 4096; }, "idle_bytes"},
      {"ranges_by_size misses a range", [](PoolSnapshot& s) { s.ranges_by_size.pop_back(); }, "ranges_by_size"},
      {"a segment miscounts its free space", [](PoolSnapshot& s) { s.segments.front().free_space -= 4096; },
       "bytes are free"},
      {"a free range overlaps an extent",
       [](PoolSnapshot& s) {
         s.ranges.front().addr -= 4096;
         s.ranges.front().size += 4096;
         s.ranges_by_size = {{s.ranges.front().size, s.ranges.front().addr}};
         s.segments.front().free_space += 4096;
       },
       "overlaps"},
      {"an extent leaves its segment", [](PoolSnapshot& s) { s.extents.back().size += 64 * MiB; },
       "not inside its segment"},
      {"the parked list forgets a parked block", [](PoolSnapshot& s) { s.parked.clear(); }, "parked"},
      {"the copies level drifts", [](PoolSnapshot& s) { s.stats.copies.current += 1; }, "copies is"},
      {"a free block has a copy begun",
       [&](PoolSnapshot& s) {
         s.blocks[index_of(s, hole.addr)].copies = 1;
         s.stats.copies.current += 1;
       },
       "free block"},
      {"a free block keeps a fence", [&](PoolSnapshot& s) { s.blocks[index_of(s, hole.addr)].fences = 1; },
       "free block"},
      {"a copy begun in an extent whose lock is being dropped",
       [&](PoolSnapshot& s) {
         for (auto& e : s.extents)
           if (e.base == first(s, BlockState::Allocated).extent) e.unlocking = true;
         for (auto& b : s.blocks)
           if (b.state == BlockState::Allocated && b.extent == first(s, BlockState::Allocated).extent) b.copies = 1;
         s.stats.copies.current = 0;
         for (const auto& b : s.blocks) s.stats.copies.current += b.copies;
       },
       "being dropped"},
      {"prewarmed_bytes drifts", [](PoolSnapshot& s) { s.stats.prewarmed_bytes.current += 4096; },
       "prewarmed_bytes"},
      {"a prewarmed extent is locked",
       [](PoolSnapshot& s) {
         for (auto& e : s.extents)
           if (e.prewarmed) e.locked = true;
       },
       "prewarmed extent"},
      {"an extent being locked keeps its block",
       [](PoolSnapshot& s) {
         for (auto& e : s.extents)
           if (e.prewarmed) {
             e.prewarmed = false;
             e.locking = true;
             s.stats.prewarmed_bytes.current -= static_cast<int64_t>(e.size);
           }
       },
       "being locked"},
      // Note [Adopted blocks]
      {"adopted_bytes drifts", [](PoolSnapshot& s) { s.stats.adopted_bytes.current += 4096; }, "adopted_bytes"},
      {"adopted_blocks drifts", [](PoolSnapshot& s) { s.stats.adopted_blocks.current -= 1; }, "adopted_blocks"},
      {"locked_bytes forgets an adopted lock",
       [](PoolSnapshot& s) { s.stats.locked_bytes.current -= static_cast<int64_t>(32 * KiB); }, "locked_bytes"},
      {"an adopted block is listed free",
       [](PoolSnapshot& s) { s.free[1].push_back({s.adopted[0].size, s.adopted[0].base}); }, "free set lists"},
      {"an adopted block is listed idle", [](PoolSnapshot& s) { s.idle.push_back({1u << 30, s.adopted[0].base}); },
       "idle set"},
      {"an adopted block loses its block",
       [](PoolSnapshot& s) { s.blocks.erase(s.blocks.begin() + static_cast<long>(index_of(s, s.adopted[0].base))); },
       "is not listed as a block"},
      {"an adopted block is cut", [](PoolSnapshot& s) { s.blocks[index_of(s, s.adopted[0].base)].size -= 4096; },
       "not one block of its own"},
      {"an adopted block is retiring but still listed", [](PoolSnapshot& s) { s.adopted[0].retiring = true; },
       "still listed"},
      {"an adopted block lies in a segment", [](PoolSnapshot& s) { s.adopted[0].base = s.segments[0].base; },
       "overlaps"},
      {"two adopted blocks overlap", [](PoolSnapshot& s) { s.adopted[1].base = s.adopted[0].base + 4096; },
       "overlaps"},
      {"two blocks in use share an extent larger than extent_min", [](PoolSnapshot& s) { s.extent_min = s.page; },
       "larger than extent_min"},
  };
  ASSERT_EQ(good.segments.size(), 1u);
  ASSERT_EQ(good.ranges.size(), 1u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PoolSnapshot bad = good;
    c.corrupt(bad);
    try {
      check_snapshot(bad);
      ADD_FAILURE() << "not caught";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Note [Host pool invariants]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pins

namespace pins {
namespace {

// Note [Copies from a block]: a fake DMA engine and a backend that watch each
// other. The backend keeps the null backend's bookkeeping and tells the engine
// about every lock, unlock and decommit; the engine counts a violation when an
// unlock drops the page-lock under a copy that was issued from locked pages and
// is still running, when a decommit takes pages a copy still reads, and when a
// block is handed out again while a copy from it still runs.
class Dma {
 public:
  struct Copy {
    uintptr_t addr;
    size_t size;
    bool from_locked;
    std::atomic<bool> done{false};
  };

  std::shared_ptr<Copy> issue(void* p, size_t n) {
    std::lock_guard<std::mutex> g(mu_);
    auto c = std::make_shared<Copy>();
    c->addr = addr(p);
    c->size = n;
    c->from_locked = false;
    for (const auto& [base, size] : locked_)
      if (c->addr >= base && c->addr + n <= base + size) c->from_locked = true;
    copies_.push_back(c);
    return c;
  }
  void complete(Copy& c) { c.done = true; }

  void locked(uintptr_t base, size_t size) {
    std::lock_guard<std::mutex> g(mu_);
    locked_.insert({base, size});
  }
  void unlocked(uintptr_t base, size_t size) {
    std::function<void()> hook = std::exchange(during_unlock, nullptr);
    {
      std::lock_guard<std::mutex> g(mu_);
      locked_.erase({base, size});
      for (const auto& c : running_locked())
        if (c->from_locked && overlaps(*c, base, size))
          fault("unlock of extent ", base, " under a copy from ", c->addr);
    }
    if (hook) hook();
  }
  void decommitted(uintptr_t base, size_t size) {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& c : running_locked())
      if (overlaps(*c, base, size)) fault("decommit of extent ", base, " under a copy from ", c->addr);
  }
  void handed_out(void* p, size_t n) {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& c : running_locked())
      if (overlaps(*c, addr(p), n)) fault("block ", addr(p), " handed out again under a copy from ", c->addr);
  }

  int violations() const {
    std::lock_guard<std::mutex> g(mu_);
    return violations_;
  }
  std::string report() const {
    std::lock_guard<std::mutex> g(mu_);
    return first_;
  }
  // Runs once, inside the next backend unlock (after the engine's check): what
  // another thread might do while an unlock() runs unlocked.
  std::function<void()> during_unlock;

 private:
  static bool overlaps(const Copy& c, uintptr_t base, size_t size) {
    return c.addr < base + size && base < c.addr + c.size;
  }
  std::vector<std::shared_ptr<Copy>> running_locked() {
    copies_.erase(std::remove_if(copies_.begin(), copies_.end(), [](const auto& c) { return c->done.load(); }),
                  copies_.end());
    return copies_;
  }
  template <typename... A>
  void fault(const A&... a) {
    if (violations_++ == 0) first_ = detail::cat(std::hex, a...);
  }

  mutable std::mutex mu_;
  std::set<std::pair<uintptr_t, size_t>> locked_;
  std::vector<std::shared_ptr<Copy>> copies_;
  int violations_ = 0;
  std::string first_;
};

class WatchedBackend final : public HostBackend {
 public:
  explicit WatchedBackend(Dma& dma) : dma_(dma), inner_(make_null_backend()) {}
  const char* name() const override { return "watched"; }
  size_t page_size() const override { return inner_->page_size(); }
  bool can_lock() const override { return true; }
  int reserve(size_t size, void** p) override { return inner_->reserve(size, p); }
  int release(void* p, size_t size) override { return inner_->release(p, size); }
  int commit(void* p, size_t size) override { return inner_->commit(p, size); }
  int decommit(void* p, size_t size) override {
    dma_.decommitted(addr(p), size);
    return inner_->decommit(p, size);
  }
  int lock(void* p, size_t size) override {
    dma_.locked(addr(p), size);
    return inner_->lock(p, size);
  }
  int unlock(void* p, size_t size) override {
    dma_.unlocked(addr(p), size);
    return inner_->unlock(p, size);
  }

 private:
  Dma& dma_;
  std::unique_ptr<HostBackend> inner_;
};

// The fence of a fake copy; `on_query` runs once, inside the first done() call.
class CopyFence final : public Fence {
 public:
  explicit CopyFence(std::shared_ptr<Dma::Copy> c, std::function<void()> on_query = nullptr)
      : copy_(std::move(c)), on_query_(std::move(on_query)) {}
  bool done() override {
    if (auto hook = std::exchange(on_query_, nullptr)) hook();
    return copy_->done.load();
  }

 private:
  std::shared_ptr<Dma::Copy> copy_;
  std::function<void()> on_query_;
};

// The window of the issue: pin B's non_blocking copy is issued, its fence not
// recorded yet, when the registration ceiling unlocks pin A of the same extent.
// Before begin_copy() the unlock judged only the fences recorded at that moment
// and dropped the extent's page-lock under B's copy.
TEST(HostPoolDma, UnlockWaitsForACopyWhoseFenceIsNotRecordedYet) {
  Dma dma;
  CheckedPool pool(std::make_unique<WatchedBackend>(dma), opts(1 * MiB));
  void* a = pool.allocate(64 * KiB);
  void* b = pool.allocate(64 * KiB);
  ASSERT_EQ(addr(b), addr(a) + 64 * KiB) << "the test needs both blocks in one extent";

  ASSERT_TRUE(pool.begin_copy(b));
  EXPECT_TRUE(pool.in_flight(b));
  const auto copy = dma.issue(b, 64 * KiB);  // cudaMemcpyAsync from B: its fence is not recorded yet
  ASSERT_TRUE(copy->from_locked);
  EXPECT_EQ(pool.unlock(a), 0u) << "B's copy is being issued in A's extent";
  EXPECT_TRUE(pool.is_locked(a));
  pool.end_copy(b, std::make_shared<CopyFence>(copy));  // the fence is recorded
  EXPECT_EQ(pool.unlock(a), 0u) << "B's fence is not done";
  dma.complete(*copy);
  EXPECT_FALSE(pool.in_flight(b));
  EXPECT_EQ(pool.unlock(a), 1 * MiB);
  EXPECT_EQ(dma.violations(), 0) << dma.report();
  EXPECT_EQ(pool.stats().busy_unlocks, 2);
  EXPECT_EQ(pool.stats().copies.current, 0);
  pool.free(a);
  pool.free(b);
}

// record_fence() queries a block's older fences unlocked, and leaves them on the
// block meanwhile: taken off, they would hide the copy from an unlock() of a
// neighbour in between, which would unlock the extent under it.
TEST(HostPoolDma, FencesStayVisibleWhileRecordFenceQueriesThem) {
  Dma dma;
  CheckedPool pool(std::make_unique<WatchedBackend>(dma), opts(1 * MiB));
  void* a = pool.allocate(64 * KiB);
  void* b = pool.allocate(64 * KiB);
  const auto first = dma.issue(b, 64 * KiB);
  size_t unlocked_meanwhile = 12345;
  // While record_fence(b, second) queries `first`, another thread unlocks a.
  pool.record_fence(b, std::make_shared<CopyFence>(first, [&] { unlocked_meanwhile = pool.unlock(a); }));
  const auto second = dma.issue(b, 64 * KiB);
  pool.record_fence(b, std::make_shared<CopyFence>(second));
  EXPECT_EQ(unlocked_meanwhile, 0u) << "the unlock did not see B's first fence";
  EXPECT_EQ(dma.violations(), 0) << dma.report();
  dma.complete(*first);
  dma.complete(*second);
  EXPECT_EQ(pool.unlock(a), 1 * MiB);
  pool.free(a);
  pool.free(b);
}

// While an unlock() runs between its lock holds (querying fences, calling the
// backend), no copy may begin on its extent: begin_copy() refuses, and the
// caller copies from the source instead.
TEST(HostPoolDma, NoCopyBeginsWhileTheLockIsDropped) {
  Dma dma;
  CheckedPool pool(std::make_unique<WatchedBackend>(dma), opts(1 * MiB));
  void* a = pool.allocate(64 * KiB);
  void* b = pool.allocate(64 * KiB);
  // Inside the backend's unlock call.
  bool began = true;
  dma.during_unlock = [&] { began = pool.begin_copy(b); };
  EXPECT_EQ(pool.unlock(a), 1 * MiB);
  EXPECT_FALSE(began) << "a copy began while the extent's page-lock was being dropped";
  // Inside the unlock's fence query.
  void* c = pool.allocate(64 * KiB);  // a new locked extent: a's is unlocked now
  void* d = pool.allocate(64 * KiB);
  ASSERT_TRUE(pool.is_locked(c));
  const auto old = dma.issue(d, 64 * KiB);
  dma.complete(*old);
  bool began_in_query = true;
  pool.record_fence(d, std::make_shared<CopyFence>(old, [&] { began_in_query = pool.begin_copy(d); }));
  EXPECT_EQ(pool.unlock(c), 1 * MiB);
  EXPECT_FALSE(began_in_query);
  EXPECT_EQ(pool.stats().copy_refusals, 2);
  // Unlocked for good: copies begin again (the driver stages pageable memory).
  EXPECT_TRUE(pool.begin_copy(b));
  pool.end_copy(b);
  EXPECT_EQ(dma.violations(), 0) << dma.report();
  for (void* p : {a, b, c, d}) pool.free(p);
}

// A block freed while its copy is being issued is parked: it is not handed out
// again until the copy ended and its fence is done.
TEST(HostPoolDma, FreeDuringACopyParksTheBlock) {
  Dma dma;
  CheckedPool pool(std::make_unique<WatchedBackend>(dma), opts(1 * MiB, 0, 0));
  void* b = pool.allocate(64 * KiB);
  void* keep = pool.allocate(64 * KiB);  // keeps the extent from going idle
  ASSERT_TRUE(pool.begin_copy(b));
  const auto copy = dma.issue(b, 64 * KiB);
  pool.free(b);
  EXPECT_EQ(pool.stats().deferred_frees, 1);
  EXPECT_TRUE(pool.snapshot().parked.size() == 1);
  void* c = pool.allocate(64 * KiB);
  dma.handed_out(c, 64 * KiB);
  pool.end_copy(b, std::make_shared<CopyFence>(copy));  // the fence of a copy from a freed block
  void* d = pool.allocate(64 * KiB);
  dma.handed_out(d, 64 * KiB);
  EXPECT_NE(c, b);
  EXPECT_NE(d, b);
  dma.complete(*copy);
  void* e = pool.allocate(64 * KiB);  // the reap returns b
  dma.handed_out(e, 64 * KiB);
  EXPECT_EQ(e, b);
  EXPECT_EQ(dma.violations(), 0) << dma.report();
  EXPECT_THROW(pool.end_copy(e), ValueError) << "no copy begun";
  EXPECT_THROW(pool.begin_copy(reinterpret_cast<char*>(e) + 512), ValueError);
  for (void* p : {c, d, e, keep}) pool.free(p);
  EXPECT_EQ(pool.stats().committed_bytes.current, 0) << "retain_free:0";
}

// Note [Adopted blocks]: a copy from an adopted block keeps its page-lock and
// its mapping (the release, where its owner unmaps) until the copy is done,
// whether the block is unlocked or freed meanwhile.
TEST(HostPoolDma, AnAdoptedBlockIsUnlockedAndReleasedOnlyAfterItsCopy) {
  Dma dma;
  CheckedPool pool(std::make_unique<WatchedBackend>(dma), opts(1 * MiB, 0, 0));
  Mapping m(256 * KiB);
  const uintptr_t base = addr(m.data());
  int released = 0;
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, [&] {
    dma.decommitted(base, m.size());  // the owner's munmap: a fault under a running copy
    released++;
    m.unmap();
  });
  ASSERT_TRUE(pool.begin_copy(p));
  const auto copy = dma.issue(p, 256 * KiB);
  ASSERT_TRUE(copy->from_locked);
  EXPECT_EQ(pool.unlock(p), 0u) << "its copy is being issued";
  pool.free(p);
  pool.end_copy(p, std::make_shared<CopyFence>(copy));
  pool.trim(0);
  void* own = pool.allocate(64 * KiB);  // a reap of its own
  EXPECT_EQ(released, 0);
  EXPECT_TRUE(pool.is_locked(own));
  dma.complete(*copy);
  pool.trim(0);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(dma.violations(), 0) << dma.report();
  pool.free(own);
}

// Threads that copy from small blocks sharing extents (begin_copy, issue, end_copy
// with the fence, complete later, free) against a thread that unlocks random
// blocks and trims: no page-lock dropped, no page decommitted and no block
// handed out again under a running copy. A quarter of the blocks are adopted
// slots of a shared mapping (Note [Adopted blocks]), whose release (the
// owner's unmap, on whichever thread reaps them) must not come under a copy
// either.
TEST(HostPoolDma, CopiersAgainstAnUnlocker) {
  Dma dma;
  constexpr size_t kSlot = 128 * KiB;
  Mapping shared(64 * kSlot);
  std::mutex slots_mu;
  std::vector<size_t> free_slots;  // LOCK: slots_mu
  for (size_t k = 0; k < 64; ++k) free_slots.push_back(k);
  std::atomic<int> adoptions{0}, releases{0};
  CheckedPool pool(std::make_unique<WatchedBackend>(dma), opts(512 * KiB, 0, 1 * MiB));
  const unsigned seed = std::random_device{}();
  std::printf("HostPoolDma.CopiersAgainstAnUnlocker seed=%u\n", seed);
  std::mutex live_mu;
  std::vector<void*> live;  // blocks the unlocker may name
  std::atomic<bool> stop{false};
  std::atomic<int> copies{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      std::vector<std::pair<void*, std::shared_ptr<Dma::Copy>>> running;
      std::vector<void*> mine;
      const auto free_one = [&](size_t k) {
        std::lock_guard<std::mutex> g(live_mu);
        live.erase(std::find(live.begin(), live.end(), mine[k]));
        pool.free(mine[k]);  // its copy may still run: the pool parks it
        mine.erase(mine.begin() + static_cast<long>(k));
      };
      for (int i = 0; i < 800; ++i) {
        size_t n = 4 * KiB + rng() % (96 * KiB);
        void* p = nullptr;
        if (rng() % 4 == 0) {
          std::lock_guard<std::mutex> g(slots_mu);
          if (!free_slots.empty()) {
            const size_t k = free_slots.back();
            free_slots.pop_back();
            n = (n + 4 * KiB - 1) / (4 * KiB) * (4 * KiB);
            p = pool.adopt(shared.at(k * kSlot), n, rng() % 8 != 0, [&, k, n] {
              dma.decommitted(addr(shared.at(k * kSlot)), n);
              releases++;
              std::lock_guard<std::mutex> g2(slots_mu);
              free_slots.push_back(k);
            });
            adoptions++;
          }
        }
        if (p == nullptr) p = pool.allocate(n, rng() % 8 != 0);
        dma.handed_out(p, n);
        {
          std::lock_guard<std::mutex> g(live_mu);
          live.push_back(p);
        }
        mine.push_back(p);
        if (pool.begin_copy(p)) {
          auto c = dma.issue(p, n);
          if (rng() % 2) std::this_thread::yield();  // the window before the fence
          pool.end_copy(p, std::make_shared<CopyFence>(c));
          running.emplace_back(p, c);
          copies++;
        } else {
          refused++;
        }
        if (!running.empty() && rng() % 3 == 0) dma.complete(*running[rng() % running.size()].second);
        if (mine.size() > 8 || rng() % 2) free_one(rng() % mine.size());
      }
      while (!mine.empty()) free_one(0);
      for (auto& [p, c] : running) dma.complete(*c);
    });
  }
  std::thread unlocker([&] {
    std::mt19937 rng(seed + 100);
    while (!stop) {
      {
        std::lock_guard<std::mutex> g(live_mu);  // names only live blocks
        if (!live.empty()) pool.unlock(live[rng() % live.size()]);
      }
      if (rng() % 16 == 0) pool.trim(rng() % 2 ? 0 : 512 * KiB);
      std::this_thread::yield();
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  unlocker.join();
  EXPECT_TRUE(live.empty());
  pool.trim(0);
  EXPECT_EQ(dma.violations(), 0) << dma.report();
  EXPECT_GT(copies.load(), 0);
  const PoolStats s = pool.stats();
  std::printf("copies %d, refused %d, unlocks %lld, busy unlocks %lld\n", copies.load(), refused.load(),
              static_cast<long long>(s.unregistrations), static_cast<long long>(s.busy_unlocks));
  EXPECT_GT(s.busy_unlocks, 0) << "the unlocker never met a copy: the test does not exercise the window";
  EXPECT_EQ(s.blocks.current, 0);
  EXPECT_EQ(s.copies.current, 0);
  EXPECT_EQ(s.committed_bytes.current, 0);
  EXPECT_GT(adoptions.load(), 0);
  EXPECT_EQ(releases.load(), adoptions.load());
  EXPECT_EQ(s.adopted_blocks.current, 0);
  EXPECT_EQ(s.locked_bytes.current, 0);
  EXPECT_EQ(free_slots.size(), 64u);
}

// Sizes near 2^64 are refused before any arithmetic on them (SIZE_MAX - 511
// would round up to 0); nothing changes in the pool.
TEST(HostPool, SizesNearTwoToTheSixtyFourAreRefused) {
  CheckedPool pool(make_null_backend(), opts());
  void* keep = pool.allocate(4096);
  const PoolStats before = pool.stats();
  for (size_t n : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 511, SIZE_MAX - 4095, SIZE_MAX / 2 + 1,
                   HostPool::kMaxAllocation + 1}) {
    SCOPED_TRACE(n);
    EXPECT_THROW(pool.try_allocate(n), ValueError);
    EXPECT_THROW(pool.allocate(n, false), ValueError);
  }
  const PoolStats after = pool.stats();
  EXPECT_EQ(after.committed_bytes.current, before.committed_bytes.current);
  EXPECT_EQ(after.reserved_bytes.current, before.reserved_bytes.current);
  EXPECT_EQ(after.allocations, before.allocations);
  // At the bound: the cap refuses cleanly; without one, the null backend serves it.
  pool.set_cap(HostPool::kMaxAllocation - 1);
  EXPECT_EQ(pool.try_allocate(HostPool::kMaxAllocation), nullptr);
  EXPECT_THROW(pool.allocate(HostPool::kMaxAllocation), ResourceError);
  pool.set_cap(SIZE_MAX);  // a cap near 2^64 does not wrap the cap arithmetic
  void* huge = pool.try_allocate(HostPool::kMaxAllocation);
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(pool.requested_size(huge), HostPool::kMaxAllocation);
  pool.free(huge);
  pool.free(keep);
  EXPECT_THROW(HostPool(make_null_backend(), [] {
                 PoolOptions o = opts();
                 o.segment_size = SIZE_MAX;
                 return o;
               }()),
               ValueError);
  EXPECT_THROW(HostPool(make_null_backend(), [] {
                 PoolOptions o = opts();
                 o.extent_min = SIZE_MAX - 4095;
                 return o;
               }()),
               ValueError);
}

// Found by fuzz/config_fuzz.cpp ("cap:1MB,"): a cap that is no multiple of the
// page cut an extent of 10^6 bytes, so the backend was asked to commit and lock
// a range that is not whole pages, and the next extent started mid-page.
TEST(HostPool, ACapOfNoWholePagesCommitsWholePages) {
  CheckedPool pool(make_null_backend(), opts(2 * MiB, 1000000));
  void* p = pool.allocate(4 * KiB);
  const PoolSnapshot s = pool.snapshot();
  ASSERT_EQ(s.extents.size(), 1u);
  EXPECT_EQ(s.extents[0].size, 1000000u / 4096 * 4096);
  void* q = pool.allocate(1000000 / 4096 * 4096 - 4 * KiB);
  EXPECT_EQ(pool.try_allocate(4 * KiB), nullptr) << "past the cap";
  EXPECT_LE(pool.stats().committed_bytes.peak, 1000000);
  pool.free(p);
  pool.free(q);
}

// The pool's commits count toward the cap whatever extent_min asks: a 4 KiB
// block under a 1 MiB cap with 64 MiB extents commits 1 MiB at most.
TEST(HostPool, ExtentMinNeverCommitsPastTheCap) {
  CheckedPool pool(make_null_backend(), opts(64 * MiB, 1 * MiB));
  void* p = pool.allocate(4 * KiB);
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(1 * MiB));
  void* q = pool.allocate(1 * MiB - 4 * KiB);
  EXPECT_EQ(pool.try_allocate(4 * KiB), nullptr);
  EXPECT_LE(pool.stats().committed_bytes.peak, static_cast<int64_t>(1 * MiB));
  pool.free(p);
  pool.free(q);
}

// Note [Warm idle memory] (csrc/balancer/budget_gate.h): the balancer moves the
// retain limit; a free keeps idle bytes up to it, and a lower limit trims at the
// next free.
TEST(HostPool, TheRetainLimitMovesAndIdleBytesAreCounted) {
  HostPool pool(make_null_backend(), opts(1 * MiB, 0, 0));
  EXPECT_EQ(pool.retain_free(), 0u);
  void* a = pool.allocate(6 * MiB);
  void* b = pool.allocate(6 * MiB);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  EXPECT_EQ(pool.committed_bytes(), 12 * MiB);
  pool.free(a);  // retain_free 0: decommitted at once
  EXPECT_EQ(pool.committed_bytes(), 6 * MiB);
  pool.set_retain_free(16 * MiB);
  EXPECT_EQ(pool.retain_free(), 16 * MiB);
  pool.free(b);  // kept warm
  EXPECT_EQ(pool.idle_bytes(), 6 * MiB);
  EXPECT_EQ(pool.committed_bytes(), 6 * MiB);
  void* c = pool.allocate(6 * MiB);  // reuses it: no commit
  EXPECT_EQ(pool.stats().commits, 2);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  pool.set_retain_free(0);
  pool.free(c);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  EXPECT_EQ(pool.committed_bytes(), 0u);
  pool.check_invariants();
}

// ------------------------------------------------------------------ prewarm (Note [Host pool layout])

// The null backend's bookkeeping, with lock() refused when asked and commit()
// held at a gate while the test wants (a commit that takes long).
class GateBackend final : public HostBackend {
 public:
  GateBackend() : inner_(make_null_backend()) {}
  const char* name() const override { return "gate"; }
  size_t page_size() const override { return inner_->page_size(); }
  bool can_lock() const override { return true; }
  int reserve(size_t size, void** p) override { return inner_->reserve(size, p); }
  int release(void* p, size_t size) override { return inner_->release(p, size); }
  int commit(void* p, size_t size) override {
    commits++;
    if (hold_commits) {
      held = true;
      while (hold_commits) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return inner_->commit(p, size);
  }
  int decommit(void* p, size_t size) override { return inner_->decommit(p, size); }
  int lock(void* p, size_t size) override {
    locks.push_back({addr(p), size});
    return refuse_locks ? ENOMEM : inner_->lock(p, size);
  }
  int unlock(void* p, size_t size) override { return inner_->unlock(p, size); }
  std::atomic<bool> hold_commits{false}, held{false}, refuse_locks{false};
  std::atomic<int> commits{0};
  std::vector<std::pair<uintptr_t, size_t>> locks;  // written by one thread at a time in these tests

 private:
  std::unique_ptr<HostBackend> inner_;
};

size_t prewarmed_extents(const PoolSnapshot& s) {
  size_t n = 0;
  for (const auto& e : s.extents) n += e.prewarmed;
  return n;
}

TEST(HostPoolPrewarm, StepsJoinAndARequestTakesItsOwnExtentCutFromThem) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pool.prewarm(8 * MiB), 8 * MiB);
  PoolSnapshot s = pool.snapshot();
  EXPECT_EQ(prewarmed_extents(s), 1u) << "four steps, one extent";
  EXPECT_EQ(s.stats.prewarms, 4);
  EXPECT_EQ(s.stats.commits, 0) << "prewarms are not the hot path's commits";
  EXPECT_EQ(pool.idle_bytes(), 32 * MiB);
  EXPECT_EQ(s.stats.committed_bytes.current, static_cast<int64_t>(32 * MiB));

  void* a = pool.allocate(20 * MiB + 100, /*lock=*/false);  // larger than any one step
  s = pool.snapshot();
  EXPECT_EQ(s.stats.commits, 0) << "served from prewarmed memory";
  EXPECT_EQ(s.stats.prewarm_served, 1);
  const size_t cut = 20 * MiB + 4096;
  EXPECT_EQ(s.stats.prewarm_served_bytes, static_cast<int64_t>(cut));
  EXPECT_EQ(s.stats.prewarmed_bytes.current, static_cast<int64_t>(32 * MiB - cut));
  EXPECT_EQ(s.extents.size(), 2u);
  EXPECT_EQ(s.extents.front().size, cut) << "the page-rounded request, as a commit would make";
  EXPECT_EQ(pool.idle_bytes(), 32 * MiB - cut);

  void* small = pool.allocate(100 * KiB, /*lock=*/false);  // shares an extent_min extent, as if committed
  s = pool.snapshot();
  EXPECT_EQ(s.stats.prewarm_served, 2);
  EXPECT_EQ(s.stats.prewarmed_bytes.current, static_cast<int64_t>(32 * MiB - cut - 1 * MiB));

  pool.free(a);  // its own extent: idle, and trimmed alone
  EXPECT_EQ(pool.idle_bytes(), 32 * MiB - 1 * MiB);
  pool.set_retain_free(0);
  pool.trim(0);
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(1 * MiB)) << "only the small one's extent";
  EXPECT_EQ(pool.stats().prewarmed_bytes.current, 0);
  pool.free(small);
  pool.trim(0);
  EXPECT_EQ(pool.stats().committed_bytes.current, 0);
}

TEST(HostPoolPrewarm, ALockedRequestLocksOnlyItsCut) {
  auto backend = std::make_unique<GateBackend>();
  GateBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  ASSERT_EQ(pool.prewarm(16 * MiB), 16 * MiB);
  ASSERT_EQ(be.commits, 1);
  void* p = pool.allocate(6 * MiB, /*lock=*/true);
  PoolStats st = pool.stats();
  EXPECT_EQ(be.commits, 1) << "no fresh pages";
  EXPECT_EQ(st.registrations, 1);
  EXPECT_EQ(st.locked_bytes.current, static_cast<int64_t>(6 * MiB));
  ASSERT_EQ(be.locks.size(), 1u);
  EXPECT_EQ(be.locks[0], std::make_pair(addr(p), size_t{6 * MiB}));
  EXPECT_TRUE(pool.is_locked(p));
  EXPECT_EQ(st.prewarmed_bytes.current, static_cast<int64_t>(10 * MiB));
  // A lock the OS refuses (Note [Refused page-locks]): the cut is served
  // unlocked, out of the prewarmed memory, with nothing new committed.
  be.refuse_locks = true;
  void* q = pool.try_allocate(4 * MiB, /*lock=*/true);
  ASSERT_NE(q, nullptr);
  EXPECT_FALSE(pool.is_locked(q));
  st = pool.stats();
  EXPECT_EQ(st.lock_failures, 1);
  EXPECT_EQ(st.refusals, 0);
  EXPECT_EQ(st.committed_bytes.current, static_cast<int64_t>(16 * MiB));
  EXPECT_EQ(st.locked_bytes.current, static_cast<int64_t>(6 * MiB));
  EXPECT_EQ(pool.idle_bytes(), 6 * MiB);
  be.refuse_locks = false;
  pool.free(q);
  pool.free(p);
}

TEST(HostPoolPrewarm, TheCapBoundsItAndIdleMemoryRulesGiveItBack) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 16 * MiB, 64 * MiB));
  EXPECT_EQ(pool.prewarm(12 * MiB), 12 * MiB);
  EXPECT_EQ(pool.prewarm(8 * MiB), 0u) << "past the cap: refused, never a decommit";
  EXPECT_EQ(pool.stats().committed_bytes.current, static_cast<int64_t>(12 * MiB));
  // A request prewarmed memory cannot hold (one extent of 12 MiB) and the cap
  // leaves no room for: prewarmed memory is decommitted like any idle extent,
  // only as much as the request needs (10 MiB).
  void* p = pool.allocate(14 * MiB, /*lock=*/false);
  const PoolStats st = pool.stats();
  EXPECT_EQ(st.prewarmed_bytes.current, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(st.prewarm_served, 0);
  EXPECT_EQ(st.committed_bytes.current, static_cast<int64_t>(16 * MiB));
  pool.free(p);
}

TEST(HostPoolPrewarm, AHotPathAllocationNeverWaitsForAPrewarmInFlight) {
  auto backend = std::make_unique<GateBackend>();
  GateBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  void* warm = pool.allocate(4 * MiB, false);
  pool.free(warm);  // an idle extent to reuse
  be.hold_commits = true;
  std::thread prewarmer([&] { EXPECT_EQ(pool.prewarm(32 * MiB), 32 * MiB); });
  while (!be.held) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The prewarm's commit runs with the pool's lock released: allocations,
  // frees and stats go on meanwhile.
  void* again = pool.allocate(4 * MiB, false);
  EXPECT_EQ(again, warm);
  EXPECT_EQ(pool.stats().prewarms, 0);
  pool.free(again);
  be.hold_commits = false;
  prewarmer.join();
  EXPECT_EQ(pool.stats().prewarms, 1);
}

}  // namespace
}  // namespace pins

namespace pins {
namespace {

// ------------------------------------------------------------------ adopted blocks (Note [Adopted blocks])

// The null backend's bookkeeping, logging every lock and unlock (and, through
// `note`, what a test adds: its releases) in one ordered list; a lock or unlock
// is refused when asked, and `during_unlock` runs once inside the next unlock.
class LogBackend final : public HostBackend {
 public:
  LogBackend() : inner_(make_null_backend()) {}
  const char* name() const override { return "log"; }
  size_t page_size() const override { return inner_->page_size(); }
  bool can_lock() const override { return true; }
  int reserve(size_t size, void** p) override { return inner_->reserve(size, p); }
  int release(void* p, size_t size) override { return inner_->release(p, size); }
  int commit(void* p, size_t size) override { return inner_->commit(p, size); }
  int decommit(void* p, size_t size) override { return inner_->decommit(p, size); }
  int lock(void* p, size_t size) override {
    note("lock", p, size);
    return refuse_locks ? ENOMEM : inner_->lock(p, size);
  }
  int unlock(void* p, size_t size) override {
    note("unlock", p, size);
    if (auto hook = std::exchange(during_unlock, nullptr)) hook();
    return refuse_unlocks ? EIO : inner_->unlock(p, size);
  }
  void note(const char* what, void* p, size_t size) {
    std::lock_guard<std::mutex> g(mu_);
    log_.push_back(detail::cat(what, " ", p, " ", size));
  }
  std::vector<std::string> log() const {
    std::lock_guard<std::mutex> g(mu_);
    return log_;
  }
  std::atomic<bool> refuse_locks{false}, refuse_unlocks{false};
  std::function<void()> during_unlock;

 private:
  std::unique_ptr<HostBackend> inner_;
  mutable std::mutex mu_;
  std::vector<std::string> log_;
};

std::string entry(const char* what, const Mapping& m) { return detail::cat(what, " ", m.data(), " ", m.size()); }
std::vector<std::string> entries(std::initializer_list<const char*> whats, const Mapping& m) {
  std::vector<std::string> out;
  for (const char* w : whats) out.push_back(entry(w, m));
  return out;
}

// A release as an owner writes it: unmap, and say so in the backend's log.
std::function<void()> unmapper(Mapping& m, LogBackend& be) {
  return [&m, &be] {
    be.note("release", m.data(), m.size());
    m.unmap();
  };
}

// Every per-block call takes an adopted block; the release runs once, after the
// unlock, with no lock of the pool held (it takes the pool's lock itself here:
// held, that would deadlock), and finds the block already forgotten.
TEST(HostPoolAdopt, ServesEveryPerBlockCallAndReleasesOnceAfterTheUnlock) {
  auto backend = std::make_unique<LogBackend>();
  LogBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  Mapping m(1 * MiB);
  const std::string unmap_entry = entry("release", m);  // m.data() is gone once unmapped
  int released = 0;
  int64_t adopted_at_release = -1;
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, [&] {
    released++;
    pool.check();
    adopted_at_release = pool.stats().adopted_blocks.current;
    be.note("release", m.data(), m.size());
    m.unmap();
  });
  EXPECT_EQ(p, m.data());
  std::memset(p, 0x5a, m.size());  // the caller's pages, as mapped
  EXPECT_TRUE(pool.is_locked(p));
  EXPECT_EQ(pool.requested_size(p), 1 * MiB);
  EXPECT_FALSE(pool.in_flight(p));
  ASSERT_TRUE(pool.begin_copy(p));
  EXPECT_TRUE(pool.in_flight(p));
  pool.end_copy(p);
  EXPECT_FALSE(pool.in_flight(p));
  std::atomic<bool> done{true};
  pool.record_fence(p, std::make_shared<FakeFence>(&done));
  EXPECT_FALSE(pool.in_flight(p));

  PoolStats s = pool.stats();
  EXPECT_EQ(s.adopted_bytes.current, static_cast<int64_t>(1 * MiB));
  EXPECT_EQ(s.adopted_blocks.current, 1);
  EXPECT_EQ(s.locked_bytes.current, static_cast<int64_t>(1 * MiB)) << "page-locked memory of this process";
  EXPECT_EQ(s.registrations, 1);
  EXPECT_EQ(s.committed_bytes.current, 0);
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.requested_bytes.current, 0);
  EXPECT_EQ(s.blocks.current, 0);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  const PoolSnapshot snap = pool.snapshot();
  ASSERT_EQ(snap.adopted.size(), 1u);
  EXPECT_EQ(snap.adopted[0].base, addr(m.data()));
  EXPECT_TRUE(snap.adopted[0].locked);
  EXPECT_TRUE(snap.extents.empty());
  EXPECT_TRUE(snap.segments.empty());
  EXPECT_TRUE(snap.free[0].empty() && snap.free[1].empty() && snap.idle.empty());

  const std::vector<std::string> want = {entry("lock", m), entry("unlock", m), unmap_entry};
  pool.free(p);  // a fence is listed: parked until a reap finds it done, as an own block
  EXPECT_EQ(released, 0);
  EXPECT_EQ(pool.snapshot().parked.size(), 1u);
  pool.trim(0);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(adopted_at_release, 0) << "released after the pool forgot it";
  EXPECT_EQ(be.log(), want);
  s = pool.stats();
  EXPECT_EQ(s.adopted_bytes.current, 0);
  EXPECT_EQ(s.adopted_bytes.allocated, static_cast<int64_t>(1 * MiB));
  EXPECT_EQ(s.adopted_bytes.freed, static_cast<int64_t>(1 * MiB));
  EXPECT_EQ(s.adopted_blocks.allocated, 1);
  EXPECT_EQ(s.adopted_blocks.freed, 1);
  EXPECT_EQ(s.locked_bytes.current, 0);
  EXPECT_EQ(s.unregistrations, 1);
  EXPECT_EQ(s.frees, 0) << "not an allocation's free";
  EXPECT_EQ(s.deferred_frees, 0);
  // Forgotten: every per-block call refuses the pointer now.
  EXPECT_THROW(pool.free(p), ValueError);
  EXPECT_THROW(pool.is_locked(p), ValueError);
  EXPECT_THROW(pool.begin_copy(p), ValueError);
  pool.trim(0);
  EXPECT_EQ(released, 1) << "released exactly once";
  EXPECT_EQ(be.log(), want);
}

// Note [Fences protect blocks]: freed with a fence pending, it is parked; the
// reaps of try_allocate() and of trim() release it only once the fence is done.
TEST(HostPoolAdopt, AFreeWithAPendingFenceParksItUntilTheFenceIsDone) {
  auto backend = std::make_unique<LogBackend>();
  LogBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  Mapping m(256 * KiB), n(256 * KiB);
  const std::vector<std::string> want = {entry("lock", m), entry("unlock", m), entry("release", m),
                                         entry("release", n)};
  std::atomic<bool> done{false};
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, unmapper(m, be));
  void* q = pool.adopt(n.data(), n.size(), /*lock=*/false, unmapper(n, be));
  pool.record_fence(p, std::make_shared<FakeFence>(&done));
  pool.record_fence(q, std::make_shared<FakeFence>(&done));
  EXPECT_TRUE(pool.in_flight(p));
  pool.free(p);
  pool.free(q);
  EXPECT_EQ(pool.snapshot().parked.size(), 2u);
  void* own = pool.allocate(4 * KiB, /*lock=*/false);  // its reap finds the fence pending
  pool.trim(0);                                        // so does this one
  EXPECT_EQ(m.unmaps, 0);
  EXPECT_EQ(n.unmaps, 0);
  EXPECT_EQ(be.log(), std::vector<std::string>{entry("lock", m)}) << "no unlock under a pending copy";
  EXPECT_EQ(pool.stats().adopted_bytes.current, static_cast<int64_t>(512 * KiB)) << "parked blocks still count";
  EXPECT_EQ(pool.stats().locked_bytes.current, static_cast<int64_t>(256 * KiB));
  done = true;
  void* own2 = pool.allocate(4 * KiB, /*lock=*/false);  // this reap releases them, in the order they were freed
  EXPECT_EQ(m.unmaps, 1);
  EXPECT_EQ(n.unmaps, 1);
  EXPECT_EQ(be.log(), want) << "n was never locked: no unlock";
  pool.trim(0);
  EXPECT_EQ(m.unmaps, 1);
  EXPECT_EQ(n.unmaps, 1);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.adopted_blocks.current, 0);
  EXPECT_EQ(s.adopted_blocks.freed, 2);
  EXPECT_EQ(s.deferred_frees, 0) << "counts the allocations' frees only";
  pool.free(own);
  pool.free(own2);
}

// Note [Copies from a block]: freed between begin_copy() and end_copy(), it is
// parked until the copy ended and the copy's fence is done.
TEST(HostPoolAdopt, AFreeDuringACopyParksItUntilTheCopyEndsAndItsFenceIsDone) {
  auto backend = std::make_unique<LogBackend>();
  LogBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  Mapping m(64 * KiB), n(64 * KiB);
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, unmapper(m, be));
  void* q = pool.adopt(n.data(), n.size(), /*lock=*/true, unmapper(n, be));
  ASSERT_TRUE(pool.begin_copy(p));
  ASSERT_TRUE(pool.begin_copy(q));
  pool.free(p);
  pool.free(q);
  pool.trim(0);
  EXPECT_EQ(m.unmaps + n.unmaps, 0) << "released under a copy being issued";
  std::atomic<bool> done{false};
  pool.end_copy(p, std::make_shared<FakeFence>(&done));  // p was freed meanwhile: allowed
  pool.end_copy(q);                                      // q's copy completed
  pool.trim(0);
  EXPECT_EQ(m.unmaps, 0) << "released under a pending fence";
  EXPECT_EQ(n.unmaps, 1);
  done = true;
  pool.trim(0);
  EXPECT_EQ(m.unmaps, 1);
  EXPECT_EQ(pool.stats().copies.current, 0);
  EXPECT_EQ(pool.stats().adopted_blocks.current, 0);
  EXPECT_THROW(pool.end_copy(p), ValueError) << "no copy begun: it is forgotten";
}

// unlock() of an adopted block drops its lock through the backend, with the
// checks of an own extent: refused while a copy is begun or a fence is pending.
TEST(HostPoolAdopt, UnlockDropsItsLockWithTheChecksOfAnExtent) {
  auto backend = std::make_unique<LogBackend>();
  LogBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  Mapping m(128 * KiB);
  const std::vector<std::string> want = entries({"lock", "unlock", "release"}, m);
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, unmapper(m, be));
  ASSERT_TRUE(pool.begin_copy(p));
  EXPECT_EQ(pool.unlock(p), 0u) << "a copy is being issued";
  std::atomic<bool> done{false};
  pool.end_copy(p, std::make_shared<FakeFence>(&done));
  EXPECT_EQ(pool.unlock(p), 0u) << "its fence is pending";
  EXPECT_TRUE(pool.is_locked(p));
  EXPECT_EQ(pool.stats().busy_unlocks, 2);
  done = true;
  EXPECT_EQ(pool.unlock(p), 128 * KiB);
  EXPECT_FALSE(pool.is_locked(p));
  EXPECT_EQ(pool.unlock(p), 0u) << "already unlocked";
  PoolStats s = pool.stats();
  EXPECT_EQ(s.locked_bytes.current, 0);
  EXPECT_EQ(s.unregistrations, 1);
  EXPECT_EQ(s.adopted_bytes.current, static_cast<int64_t>(128 * KiB)) << "still adopted";
  EXPECT_TRUE(pool.begin_copy(p)) << "a copy from pageable memory is staged by the driver";
  pool.end_copy(p);
  pool.free(p);
  pool.trim(0);  // its done fence was still listed: the reap releases it
  EXPECT_EQ(be.log(), want) << "released without a second unlock";
  EXPECT_EQ(m.unmaps, 1);
}

// An unlock() between its lock holds (inside the backend's unlock here) still
// uses the block: a free meanwhile parks it, a copy may not begin, and the
// release waits for the next reap.
TEST(HostPoolAdopt, AFreeWhileItsUnlockRunsParksIt) {
  auto backend = std::make_unique<LogBackend>();
  LogBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  Mapping m(64 * KiB);
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, unmapper(m, be));
  bool began = true;
  be.during_unlock = [&] {
    began = pool.begin_copy(p);
    pool.free(p);
  };
  EXPECT_EQ(pool.unlock(p), 64 * KiB);
  EXPECT_FALSE(began) << "a copy began while the page-lock was being dropped";
  EXPECT_EQ(m.unmaps, 0) << "released while its unlock still ran";
  EXPECT_EQ(pool.snapshot().parked.size(), 1u);
  pool.trim(0);
  EXPECT_EQ(m.unmaps, 1);
  EXPECT_EQ(pool.stats().unregistrations, 1);
  EXPECT_EQ(pool.stats().copy_refusals, 1);
}

// A lock the backend refuses leaves the block unlocked (counted); an unlock it
// refuses at retirement is counted and the block released all the same; a
// backend that cannot lock is never asked.
TEST(HostPoolAdopt, RefusedLocksAndUnlocksAreCounted) {
  auto backend = std::make_unique<LogBackend>();
  LogBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
  Mapping m(64 * KiB), n(64 * KiB), u(64 * KiB);
  be.refuse_locks = true;
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, unmapper(m, be));
  EXPECT_EQ(p, m.data());
  EXPECT_FALSE(pool.is_locked(p));
  PoolStats s = pool.stats();
  EXPECT_EQ(s.lock_failures, 1);
  EXPECT_EQ(s.refusals, 0) << "nothing was refused: the block is served unlocked";
  EXPECT_EQ(s.locked_bytes.current, 0);
  EXPECT_EQ(s.registrations, 0);
  be.refuse_locks = false;
  void* q = pool.adopt(n.data(), n.size(), /*lock=*/true, unmapper(n, be));
  void* r = pool.adopt(u.data(), u.size(), /*lock=*/false, unmapper(u, be));
  EXPECT_FALSE(pool.is_locked(r));
  be.refuse_unlocks = true;
  const std::vector<std::string> want = {entry("lock", m), entry("lock", n), entry("release", m),
                                         entry("unlock", n), entry("release", n), entry("release", u)};
  pool.free(p);
  pool.free(q);
  pool.free(r);
  EXPECT_EQ(be.log(), want);
  s = pool.stats();
  EXPECT_EQ(s.lock_failures, 2);
  EXPECT_EQ(s.unregistrations, 0);
  EXPECT_EQ(s.locked_bytes.current, 0) << "forgotten with its lock";
  EXPECT_EQ(m.unmaps + n.unmaps + u.unmaps, 3);

  HostPool plain(make_cpu_backend(/*use_mlock=*/false), opts());  // can_lock() false
  Mapping w(64 * KiB);
  void* x = plain.adopt(w.data(), w.size(), /*lock=*/true, [&] { w.unmap(); });
  EXPECT_FALSE(plain.is_locked(x));
  EXPECT_EQ(plain.stats().lock_failures, 0);
  plain.free(x);
  EXPECT_EQ(w.unmaps, 1);
  plain.check_invariants();
}

// ~HostPool releases every block still adopted, live or parked, each once and
// after its unlock.
TEST(HostPoolAdopt, TheDestructorReleasesBlocksStillAdopted) {
  Mapping m(64 * KiB), n(128 * KiB), k(64 * KiB);
  std::atomic<bool> pending{false};
  std::vector<std::string> log;
  {
    auto backend = std::make_unique<LogBackend>();
    LogBackend& be = *backend;
    HostPool pool(std::move(backend), opts(1 * MiB, 0, 64 * MiB));
    void* own = pool.allocate(4 * KiB, /*lock=*/false);
    pool.free(own);
    pool.adopt(m.data(), m.size(), /*lock=*/true, unmapper(m, be));
    pool.adopt(n.data(), n.size(), /*lock=*/false, unmapper(n, be));
    void* parked = pool.adopt(k.data(), k.size(), /*lock=*/true, unmapper(k, be));
    pool.record_fence(parked, std::make_shared<FakeFence>(&pending));
    pool.free(parked);
    pool.check_invariants();
    EXPECT_EQ(m.unmaps + n.unmaps + k.unmaps, 0);
    log = be.log();
    EXPECT_EQ(log.size(), 2u);  // the two locks
    // The log dies with the backend: the destructor's calls are seen through the unmaps.
  }
  EXPECT_EQ(m.unmaps, 1);
  EXPECT_EQ(n.unmaps, 1);
  EXPECT_EQ(k.unmaps, 1);
}

// The destructor's order, seen from outside the pool: a backend that outlives
// it records the unlock before the release.
TEST(HostPoolAdopt, TheDestructorUnlocksBeforeItReleases) {
  Mapping m(64 * KiB);
  const std::vector<std::string> want = entries({"lock", "unlock", "release"}, m);
  auto backend = std::make_unique<LogBackend>();
  LogBackend* be = backend.get();
  std::vector<std::string> seen;
  {
    HostPool pool(std::move(backend), opts());
    pool.adopt(m.data(), m.size(), /*lock=*/true, [&] {
      be->note("release", m.data(), m.size());  // the backend is still alive: members die after the body
      seen = be->log();
      m.unmap();
    });
  }
  EXPECT_EQ(seen, want);
}

// Bad input is a pins::ValueError naming the argument and what it got, with
// nothing changed.
TEST(HostPoolAdopt, BadInputIsAValueErrorNamingTheArgument) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, 0, 64 * MiB));
  Mapping m(64 * KiB);
  int released = 0;
  const auto release = [&] { released++; };
  const auto expect_error = [&](std::function<void()> call, std::vector<std::string> words) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const ValueError& e) {
      for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  expect_error([&] { pool.adopt(nullptr, 4096, true, release); }, {"HostPool::adopt", "data must not be null"});
  expect_error([&] { pool.adopt(m.at(512), 4096, true, release); },
               {"data must be page-aligned", "page 4096", detail::cat(static_cast<void*>(m.at(512)))});
  expect_error([&] { pool.adopt(m.data(), 0, true, release); }, {"size must be a positive multiple", "got 0"});
  expect_error([&] { pool.adopt(m.data(), 4097, true, release); }, {"size", "got 4097"});
  expect_error([&] { pool.adopt(m.data(), HostPool::kMaxAllocation + 4096, true, release); },
               {"size", std::to_string(HostPool::kMaxAllocation + 4096)});
  expect_error([&] { pool.adopt(reinterpret_cast<void*>(~uintptr_t{4095}), 8192, true, release); },
               {"runs past the end of the address space"});
  expect_error([&] { pool.adopt(m.data(), 4096, true, nullptr); }, {"release must be a callable"});
  void* p = pool.adopt(m.at(16 * KiB), 16 * KiB, true, release);
  expect_error([&] { pool.adopt(m.data(), m.size(), true, release); }, {"overlaps an adopted block"});
  expect_error([&] { pool.adopt(m.at(28 * KiB), 4096, true, release); }, {"overlaps an adopted block"});
  void* own = pool.allocate(4 * KiB);  // the null backend's segment
  expect_error([&] { pool.adopt(own, 4096, true, release); }, {"overlaps a segment"});
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.adopted_blocks.allocated, 1) << "only the good call adopted";
  EXPECT_EQ(s.registrations, 2);
  // Neighbours are not overlaps.
  void* before = pool.adopt(m.data(), 16 * KiB, false, release);
  void* after = pool.adopt(m.at(32 * KiB), 32 * KiB, false, release);
  for (void* x : {p, before, after, own}) pool.free(x);
  EXPECT_EQ(released, 3);
}

// It stays out of everything that manages own memory: the cap, trim(), the
// retain limit, prewarm, committed and idle bytes.
TEST(HostPoolAdopt, StaysOutOfOwnMemory) {
  CheckedPool pool(make_null_backend(), opts(1 * MiB, /*cap=*/4 * MiB, /*retain=*/0));
  Mapping m(8 * MiB);
  int released = 0;
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/false, [&] { released++; });  // twice the cap
  EXPECT_EQ(pool.stats().committed_bytes.current, 0);
  void* own = pool.allocate(4 * MiB, false);  // the cap is all the pool's own
  EXPECT_EQ(pool.prewarm(1 * MiB), 0u) << "past the cap by own memory only";
  pool.free(own);
  EXPECT_EQ(pool.prewarm(2 * MiB), 2 * MiB);
  EXPECT_EQ(pool.idle_bytes(), 2 * MiB);
  EXPECT_EQ(pool.trim(0), 2 * MiB) << "only the prewarmed memory";
  EXPECT_EQ(released, 0);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.committed_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, 0);
  EXPECT_EQ(s.adopted_bytes.current, static_cast<int64_t>(8 * MiB));
  EXPECT_EQ(s.adopted_bytes.peak, static_cast<int64_t>(8 * MiB));
  pool.free(p);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  EXPECT_EQ(pool.stats().decommits, 2) << "the freed 4 MiB and the trimmed prewarm; nothing adopted";
  pool.reset_peak();
  EXPECT_EQ(pool.stats().adopted_bytes.peak, 0);
}

// The sanitizers' runtimes intercept mlock() and munlock() and do nothing
// (their shadow memory would make a lock deadly): the calls succeed and VmLck
// stays 0 there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kMlockIntercepted = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kMlockIntercepted = true;
#else
constexpr bool kMlockIntercepted = false;
#endif
#else
constexpr bool kMlockIntercepted = false;
#endif

// mlock on a shared mapping: the pages count in VmLck (Linux) while adopted
// and locked, and leave it on release.
TEST(HostPoolAdopt, MlockLocksASharedMapping) {
  CheckedPool pool(make_cpu_backend(/*use_mlock=*/true), opts());
  Mapping m(1 * MiB);
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, [&] { m.unmap(); });
  if (!pool.is_locked(p)) {
    pool.free(p);
    GTEST_SKIP() << "mlock refused here (RLIMIT_MEMLOCK); cannot test the mlock path";
  }
  std::memset(p, 1, m.size());
#if !defined(_WIN32)
  const auto vm_lck_kib = [] {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmLck:", 0) == 0) return std::stoll(line.substr(6));
    return -1LL;
  };
  const long long held = vm_lck_kib();
  if (!kMlockIntercepted) EXPECT_GE(held, static_cast<long long>(1 * MiB / KiB));
#endif
  pool.free(p);
  EXPECT_EQ(m.unmaps, 1);
  EXPECT_EQ(pool.stats().unregistrations, 1);
#if !defined(_WIN32)
  if (!kMlockIntercepted) EXPECT_LE(vm_lck_kib(), held - static_cast<long long>(1 * MiB / KiB));
#endif
}

TEST(HostPoolAdopt, CudaBackendRegistersASharedMapping) {
  auto backend = make_cuda_backend();
  if (!backend) GTEST_SKIP() << "no CUDA device (or pins built without CUDA): cudaHostRegister path not testable";
  CheckedPool pool(std::move(backend), opts());
  Mapping m(4 * MiB);
  void* p = pool.adopt(m.data(), m.size(), /*lock=*/true, [&] { m.unmap(); });
  EXPECT_TRUE(pool.is_locked(p));
  EXPECT_EQ(pool.stats().lock_failures, 0);
  std::memset(p, 1, m.size());
  pool.free(p);
  EXPECT_EQ(pool.stats().unregistrations, 1);
  EXPECT_EQ(pool.stats().lock_failures, 0) << "cudaHostUnregister refused";
  EXPECT_EQ(m.unmaps, 1);
}

// ------------------------------------------------------------------ refused page-locks

// Note [Refused page-locks]: a backend that refuses to lock more than 4 MiB at
// once (cudaHostRegister on WSL2 past about 500 MB) still gets every request
// served: the large ones from unlocked memory, counted, with one warning.
TEST(HostPoolRefusedLocks, ALargeRequestIsServedUnlockedCountedAndWarnedOnce) {
  auto backend = std::make_unique<testing::LockLimitBackend>(make_cpu_backend(/*use_mlock=*/false), 4 * MiB);
  testing::LockLimitBackend& be = *backend;
  CheckedPool pool(std::move(backend), opts(1 * MiB, 0, 0));
  ::testing::internal::CaptureStderr();
  void* big = pool.try_allocate(6 * MiB, /*lock=*/true);
  void* bigger = pool.try_allocate(8 * MiB, /*lock=*/true);
  void* small = pool.try_allocate(64 * KiB, /*lock=*/true);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(big, nullptr) << "refused: a request that asked for a lock the backend cannot give";
  ASSERT_NE(bigger, nullptr);
  ASSERT_NE(small, nullptr);
  EXPECT_FALSE(pool.is_locked(big));
  EXPECT_FALSE(pool.is_locked(bigger));
  EXPECT_TRUE(pool.is_locked(small)) << "a lock the backend gives is taken";
  std::memset(big, 0x5a, 6 * MiB);  // committed memory: usable
  std::memset(bigger, 0x5b, 8 * MiB);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.lock_failures, 2);
  EXPECT_EQ(s.refusals, 0);
  EXPECT_EQ(s.registrations, 1);
  EXPECT_EQ(s.locked_bytes.current, static_cast<int64_t>(1 * MiB));
  EXPECT_EQ(s.committed_bytes.current, static_cast<int64_t>(15 * MiB));
  EXPECT_EQ(be.locks, 3);
  size_t lines = 0;
  for (size_t at = err.find("pins: warning: "); at != std::string::npos; at = err.find("pins: warning: ", at + 1))
    lines++;
  EXPECT_EQ(lines, 1u) << err;
  EXPECT_NE(err.find("refused to page-lock 6291456 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("lock_failures"), std::string::npos) << err;
  // An unlocked extent serves a request that asks for no lock, and goes back
  // to the OS like any other.
  pool.free(big);
  void* plain = pool.try_allocate(2 * MiB, /*lock=*/false);
  EXPECT_EQ(addr(plain), addr(big)) << "the idle unlocked extent was reused";
  pool.free(plain);
  pool.free(bigger);
  pool.free(small);
  pool.trim(0);
  EXPECT_EQ(pool.stats().committed_bytes.current, 0);
}

}  // namespace
}  // namespace pins
