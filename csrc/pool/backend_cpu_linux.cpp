// The cpu backend on Linux: mmap, madvise, and mlock when asked (the Windows
// one is backend_cpu_win.cpp).
#include "csrc/pool/backend_cpu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <system_error>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace pins {

CpuBackend::CpuBackend(bool use_mlock)
    : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))), mlock_(use_mlock) {}

int CpuBackend::reserve(size_t size, void** addr) {
  // NORESERVE: address space only; pages are charged when commit() touches them.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return errno;
  *addr = p;
  return 0;
}

int CpuBackend::release(void* addr, size_t size) { return munmap(addr, size) == 0 ? 0 : errno; }

namespace {

// Faulting in (zeroing) fresh pages runs at 1-2 GB/s on one thread, so a large
// commit populates chunks of at least kChunk on up to kMaxThreads threads.
constexpr size_t kChunk = size_t{32} << 20;
constexpr unsigned kMaxThreads = 4;

int populate(void* addr, size_t size, size_t page) {
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const size_t n = std::min<size_t>({std::min(cpus, kMaxThreads), size / kChunk, size_t{kMaxThreads}});
  if (n <= 1) return madvise(addr, size, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
  const size_t step = (size / n + page - 1) / page * page;
  std::vector<int> rc(n, 0);
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) {
    const size_t off = i * step;
    if (off >= size) break;
    const size_t len = std::min(step, size - off);
    try {
      threads.emplace_back([&rc, i, p = static_cast<char*>(addr) + off, len] {
        rc[i] = madvise(p, len, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
      });
    } catch (const std::system_error&) {  // no thread: this one does the chunk
      rc[i] = madvise(static_cast<char*>(addr) + off, len, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
    }
  }
  rc[0] = madvise(addr, std::min(step, size), MADV_POPULATE_WRITE) == 0 ? 0 : errno;
  for (std::thread& t : threads) t.join();
  for (int r : rc)
    if (r != 0) return r;
  return 0;
}

}  // namespace

int CpuBackend::commit(void* addr, size_t size) {
  // Populate now so a committed range is real RAM (and fails here, not on first use).
  static std::atomic<bool> populate_works{true};
  if (populate_works.load(std::memory_order_relaxed)) {
    const int rc = populate(addr, size, page_);
    if (rc == 0) return 0;
    if (rc != EINVAL) return rc;  // ENOMEM etc.: a real refusal
    populate_works.store(false, std::memory_order_relaxed);  // kernel < 5.14
  }
  auto* p = static_cast<volatile char*>(addr);
  for (size_t off = 0; off < size; off += page_) p[off] = 0;
  return 0;
}

int CpuBackend::decommit(void* addr, size_t size) {
  return madvise(addr, size, MADV_DONTNEED) == 0 ? 0 : errno;
}

int CpuBackend::lock(void* addr, size_t size) {
  if (!mlock_) return ENOTSUP;
  return mlock(addr, size) == 0 ? 0 : errno;
}

int CpuBackend::unlock(void* addr, size_t size) {
  if (!mlock_) return ENOTSUP;
  return munlock(addr, size) == 0 ? 0 : errno;
}

std::unique_ptr<HostBackend> make_cpu_backend(bool use_mlock) { return std::make_unique<CpuBackend>(use_mlock); }

}  // namespace pins
