// The cpu backend: mmap, madvise, and mlock when asked.
#include "csrc/pool/backend_cpu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace pins {

MmapBackend::MmapBackend(bool use_mlock)
    : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))), mlock_(use_mlock) {}

int MmapBackend::reserve(size_t size, void** addr) {
  // NORESERVE: address space only; pages are charged when commit() touches them.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return errno;
  *addr = p;
  return 0;
}

int MmapBackend::release(void* addr, size_t size) { return munmap(addr, size) == 0 ? 0 : errno; }

int MmapBackend::commit(void* addr, size_t size) {
  // Populate now so a committed range is real RAM (and fails here, not on first use).
  static std::atomic<bool> populate_works{true};
  if (populate_works.load(std::memory_order_relaxed)) {
    if (madvise(addr, size, MADV_POPULATE_WRITE) == 0) return 0;
    if (errno != EINVAL) return errno;  // ENOMEM etc.: a real refusal
    populate_works.store(false, std::memory_order_relaxed);  // kernel < 5.14
  }
  auto* p = static_cast<volatile char*>(addr);
  for (size_t off = 0; off < size; off += page_) p[off] = 0;
  return 0;
}

int MmapBackend::decommit(void* addr, size_t size) {
  return madvise(addr, size, MADV_DONTNEED) == 0 ? 0 : errno;
}

int MmapBackend::lock(void* addr, size_t size) {
  if (!mlock_) return ENOTSUP;
  return mlock(addr, size) == 0 ? 0 : errno;
}

int MmapBackend::unlock(void* addr, size_t size) {
  if (!mlock_) return ENOTSUP;
  return munlock(addr, size) == 0 ? 0 : errno;
}

std::unique_ptr<HostBackend> make_cpu_backend(bool use_mlock) { return std::make_unique<MmapBackend>(use_mlock); }

}  // namespace pins
