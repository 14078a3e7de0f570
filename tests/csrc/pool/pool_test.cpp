#include "csrc/pool/pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include "csrc/base/check.h"
#include "csrc/base/size.h"

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

 private:
  std::atomic<bool>* flag_;
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
  void record_fence(void* ptr, std::shared_ptr<Fence> fence) {
    Checker c{*this};
    pool_.record_fence(ptr, std::move(fence));
  }
  bool in_flight(void* ptr) { return pool_.in_flight(ptr); }
  size_t trim(size_t keep_idle = 0) {
    Checker c{*this};
    return pool_.trim(keep_idle);
  }
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

int64_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
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
  CheckedPool pool(make_null_backend(), opts(256 * KiB, 0, 1 * MiB));
  const unsigned seed = std::random_device{}();
  std::printf("HostPoolInvariants.HoldAcrossRandomCalls seed=%u\n", seed);
  std::mt19937 rng(seed);
  std::vector<std::shared_ptr<std::atomic<bool>>> flags;
  std::vector<void*> live;
  for (int i = 0; i < 3000; ++i) {
    switch (rng() % 8) {
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
        break;
    }
  }
  for (auto& f : flags) *f = true;
  for (void* p : live) pool.free(p);
  pool.trim(0);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.blocks.current, 0);
  EXPECT_EQ(s.committed_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, 0);
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
    pool_.free(b);     // a hole between a and c
    pool_.record_fence(c, std::make_shared<FakeFence>(&pending_));
    pool_.free(c);  // parked
    good_ = pool_.snapshot();
  }
  void TearDown() override {
    pending_ = true;
    for (void* p : {a_, big_, plain_}) pool_.free(p);
    pool_.trim(0);
    pool_.check_invariants();
    EXPECT_EQ(pool_.stats().committed_bytes.current, 0);
  }

  std::atomic<bool> pending_{false};
  HostPool pool_{make_null_backend(), opts(1 * MiB, 0, 64 * MiB)};
  void* a_ = nullptr;
  void* big_ = nullptr;
  void* plain_ = nullptr;
  PoolSnapshot good_;
};

const PoolSnapshot::Block& first(const PoolSnapshot& s, BlockState state) {
  for (const auto& b : s.blocks)
    if (b.state == state) return b;
  throw std::logic_error("no such block in the snapshot");
}

size_t index_of(const PoolSnapshot& s, uintptr_t addr) {
  for (size_t i = 0; i < s.blocks.size(); ++i)
    if (s.blocks[i].addr == addr) return i;
  throw std::logic_error("no such block in the snapshot");
}

TEST_F(BusyPool, SnapshotPasses) {
  EXPECT_NO_THROW(check_snapshot(good_));
  EXPECT_NO_THROW(pool_.check_invariants());
  EXPECT_EQ(good_.parked.size(), 1u);
  EXPECT_EQ(good_.idle.size(), 1u);
  EXPECT_EQ(good_.extents.size(), 4u);
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
