// The cpu backend on Windows: VirtualAlloc, VirtualFree, and VirtualLock when
// asked (Note [Host backend contract]; the Linux one is backend_cpu_linux.cpp).
//
// Note [Windows page locks]
// VirtualLock keeps pages in the process's working set, and a process may lock
// no more than its minimum working set (less a few pages the system keeps for
// itself): a few hundred KiB by default, so a lock of any pin's size fails with
// ERROR_WORKING_SET_QUOTA. lock() therefore raises the minimum (and the maximum
// with it) by the range's size with SetProcessWorkingSetSizeEx before it locks,
// and unlock() lowers both again after. Raising the minimum needs
// SeIncreaseWorkingSetPrivilege, which Windows grants to users by default; where
// it is refused, or the system has no RAM left to promise, lock() fails and the
// pool counts a lock failure (the cuda backend's cudaHostRegister does not go
// through the working set at all). The two sizes are one process-wide setting
// that two threads must not update at once, and another library of the process
// may set them too: lock() and unlock() change them by their own sizes, from
// what they are now, never to absolute values of their own.
#include "csrc/pool/backend_cpu.h"

#include <windows.h>

#include <cerrno>
#include <mutex>

namespace pins {
namespace {

// An errno-style code for a Win32 error (Note [Host backend contract]).
int error_code(DWORD error) {
  switch (error) {
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_COMMITMENT_LIMIT:
    case ERROR_WORKING_SET_QUOTA:
    case ERROR_NO_SYSTEM_RESOURCES:
      return ENOMEM;
    case ERROR_ACCESS_DENIED:
    case ERROR_PRIVILEGE_NOT_HELD:
      return EPERM;
    case ERROR_INVALID_PARAMETER:
    case ERROR_INVALID_ADDRESS:
      return EINVAL;
    default:
      return EIO;
  }
}

int last_error_code() { return error_code(GetLastError()); }

// Note [Windows page locks]: grows (`grow`) or shrinks the working set's
// minimum and maximum by `size`; 0 or an errno-style code. A leaf lock, held
// over two quick calls that wait on nothing.
std::mutex g_working_set_mu;

int resize_working_set(size_t size, bool grow) {
  std::lock_guard<std::mutex> g(g_working_set_mu);
  const HANDLE self = GetCurrentProcess();
  SIZE_T lo = 0, hi = 0;
  DWORD flags = 0;
  if (!GetProcessWorkingSetSizeEx(self, &lo, &hi, &flags)) return last_error_code();
  if (grow) {
    lo += size;
    hi += size;
  } else {
    lo = lo > size ? lo - size : lo;  // another library lowered it meanwhile: leave it
    hi = hi > size ? hi - size : hi;
  }
  return SetProcessWorkingSetSizeEx(self, lo, hi, flags) ? 0 : last_error_code();
}

size_t system_page_size() {
  SYSTEM_INFO si;
  GetSystemInfo(&si);
  return si.dwPageSize;
}

}  // namespace

CpuBackend::CpuBackend(bool use_mlock) : page_(system_page_size()), mlock_(use_mlock) {}

int CpuBackend::reserve(size_t size, void** addr) {
  // Address space only, charged to nothing until commit(). VirtualAlloc rounds
  // the base to the allocation granularity (64 KiB), a multiple of the page.
  void* p = VirtualAlloc(nullptr, size, MEM_RESERVE, PAGE_NOACCESS);
  if (p == nullptr) return last_error_code();
  *addr = p;
  return 0;
}

// The pool releases whole reserved ranges only (Note [Host backend contract]),
// which is what MEM_RELEASE takes: the base that reserve() returned, size 0.
int CpuBackend::release(void* addr, size_t) { return VirtualFree(addr, 0, MEM_RELEASE) ? 0 : last_error_code(); }

int CpuBackend::commit(void* addr, size_t size) {
  // MEM_COMMIT charges the range to the system's commit limit (a refusal is
  // ERROR_COMMITMENT_LIMIT here, not a fault later) but backs no page yet.
  // Windows has no MADV_POPULATE_WRITE for private memory (PrefetchVirtualMemory
  // reads mapped files in), so a write to every page backs the range now, as the
  // contract asks: RAM in the working set.
  if (VirtualAlloc(addr, size, MEM_COMMIT, PAGE_READWRITE) == nullptr) return last_error_code();
  auto* p = static_cast<volatile char*>(addr);
  for (size_t off = 0; off < size; off += page_) p[off] = 0;
  return 0;
}

// A decommitted page reads as zeros when committed again, as the contract asks.
int CpuBackend::decommit(void* addr, size_t size) {
  return VirtualFree(addr, size, MEM_DECOMMIT) ? 0 : last_error_code();
}

int CpuBackend::lock(void* addr, size_t size) {
  if (!mlock_) return ENOTSUP;
  // Note [Windows page locks]
  if (const int err = resize_working_set(size, true); err != 0) return err;
  if (VirtualLock(addr, size)) return 0;
  const int err = last_error_code();
  resize_working_set(size, false);
  return err;
}

int CpuBackend::unlock(void* addr, size_t size) {
  if (!mlock_) return ENOTSUP;
  if (!VirtualUnlock(addr, size)) return last_error_code();
  resize_working_set(size, false);  // Note [Windows page locks]
  return 0;
}

std::unique_ptr<HostBackend> make_cpu_backend(bool use_mlock) { return std::make_unique<CpuBackend>(use_mlock); }

}  // namespace pins
