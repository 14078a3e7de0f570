// The cpu backend on Windows (backend_cpu_win.cpp): Note [Host backend
// contract] with VirtualAlloc, and Note [Windows page locks].
#include <gtest/gtest.h>

#include <windows.h>

#include <cerrno>
#include <cstring>

#include "csrc/base/size.h"
#include "csrc/pool/backend.h"
#include "csrc/pool/pool.h"

namespace pins {
namespace {

// The working set's minimum, in bytes.
size_t working_set_min() {
  SIZE_T lo = 0, hi = 0;
  DWORD flags = 0;
  EXPECT_TRUE(GetProcessWorkingSetSizeEx(GetCurrentProcess(), &lo, &hi, &flags));
  return lo;
}

TEST(CpuBackendWindows, KeepsTheContract) {
  auto b = make_cpu_backend(false);
  EXPECT_STREQ(b->name(), "cpu");
  EXPECT_EQ(b->page_size(), 4096u);
  EXPECT_FALSE(b->can_lock());
  void* p = nullptr;
  ASSERT_EQ(b->reserve(64 * MiB, &p), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (64 * KiB), 0u);
  char* c = static_cast<char*>(p) + 4 * MiB;  // an extent inside the segment, as the pool commits them
  ASSERT_EQ(b->commit(c, 8 * MiB), 0);
  std::memset(c, 0x5a, 8 * MiB);
  EXPECT_EQ(b->decommit(c, 8 * MiB), 0);
  ASSERT_EQ(b->commit(c, 8 * MiB), 0);
  for (size_t off = 0; off < 8 * MiB; off += 4096) ASSERT_EQ(c[off], 0) << "a decommitted page kept its bytes";
  EXPECT_EQ(b->lock(c, 8 * MiB), ENOTSUP);
  EXPECT_EQ(b->decommit(c, 8 * MiB), 0);
  EXPECT_EQ(b->release(p, 64 * MiB), 0);
}

TEST(CpuBackendWindows, LocksMoreThanTheDefaultWorkingSet) {
  auto b = make_cpu_backend(true);
  EXPECT_TRUE(b->can_lock());
  void* p = nullptr;
  ASSERT_EQ(b->reserve(64 * MiB, &p), 0);
  ASSERT_EQ(b->commit(p, 64 * MiB), 0);
  ASSERT_EQ(b->lock(p, 64 * MiB), 0);  // Note [Windows page locks]: far above the default minimum
  static_cast<char*>(p)[12345] = 7;
  EXPECT_EQ(b->unlock(p, 64 * MiB), 0);
  EXPECT_EQ(static_cast<char*>(p)[12345], 7);  // unlocking keeps the bytes
  EXPECT_EQ(b->decommit(p, 64 * MiB), 0);
  EXPECT_EQ(b->release(p, 64 * MiB), 0);
}

// Whether the system reports the working set it was given (wine 8 takes any
// and reports a fixed one).
bool reports_working_set() {
  SIZE_T lo = 0, hi = 0;
  DWORD flags = 0;
  GetProcessWorkingSetSizeEx(GetCurrentProcess(), &lo, &hi, &flags);
  if (!SetProcessWorkingSetSizeEx(GetCurrentProcess(), lo + 4096, hi + 4096, flags)) return false;
  const bool reported = working_set_min() == lo + 4096;
  SetProcessWorkingSetSizeEx(GetCurrentProcess(), lo, hi, flags);
  return reported;
}

TEST(CpuBackendWindows, ALockRaisesTheWorkingSetAndTheUnlockLowersIt) {
  if (!reports_working_set()) GTEST_SKIP() << "this system does not report the working set it is given (wine)";
  auto b = make_cpu_backend(true);
  void* p = nullptr;
  ASSERT_EQ(b->reserve(64 * MiB, &p), 0);
  ASSERT_EQ(b->commit(p, 64 * MiB), 0);
  const size_t before = working_set_min();
  ASSERT_EQ(b->lock(p, 64 * MiB), 0);
  EXPECT_EQ(working_set_min(), before + 64 * MiB);
  EXPECT_EQ(b->unlock(p, 64 * MiB), 0);
  EXPECT_EQ(working_set_min(), before);
  EXPECT_EQ(b->decommit(p, 64 * MiB), 0);
  EXPECT_EQ(b->release(p, 64 * MiB), 0);
}

TEST(CpuBackendWindows, AnUncommittedRangeIsNotLocked) {
  auto b = make_cpu_backend(true);
  void* p = nullptr;
  ASSERT_EQ(b->reserve(1 * MiB, &p), 0);
  const size_t before = working_set_min();
  EXPECT_NE(b->lock(p, 1 * MiB), 0);
  EXPECT_EQ(working_set_min(), before) << "a refused lock gives back what it raised";
  EXPECT_EQ(b->release(p, 1 * MiB), 0);
}

TEST(CpuBackendWindows, APoolOnItLocksAndFreesBlocks) {
  PoolOptions o;
  o.segment_size = 64 * MiB;
  o.extent_min = 1 * MiB;
  o.retain_free = 0;
  HostPool pool(make_cpu_backend(true), o);
  void* a = pool.allocate(3 * MiB, true);
  void* u = pool.allocate(5 * MiB, false);
  std::memset(a, 1, 3 * MiB);
  std::memset(u, 2, 5 * MiB);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.backend, std::string("cpu"));
  EXPECT_EQ(s.locked_bytes.current, static_cast<int64_t>(3 * MiB));
  EXPECT_EQ(s.lock_failures, 0);
  pool.free(a);
  pool.free(u);
  s = pool.stats();
  EXPECT_EQ(s.committed_bytes.current, 0);
  EXPECT_EQ(s.locked_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, 0);
}

}  // namespace
}  // namespace pins
