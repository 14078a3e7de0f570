// The operating-system layer of the host pool.
//
// Note [Host backend contract]
// The pool only ever calls a backend with page-aligned addresses and sizes that
// are positive multiples of page_size(), on ranges it got from reserve(), or,
// for lock and unlock only, on a range a caller mapped and gave the pool
// (Note [Adopted blocks] in pool.h). Every call returns 0 on success or an
// errno-style code; on failure nothing changed.
//   reserve   address space only: no RAM is used until commit.
//   release   gives a whole reserved range back (it holds no committed pages).
//   commit    backs a range with RAM (populated, so RSS shows it).
//   decommit  returns a committed, unlocked range's RAM to the OS; it reads as
//             zeros if committed again.
//   lock      page-locks a committed range so the device can DMA from it; a
//             locked range is unlocked exactly as it was locked (same base,
//             same size) before it is decommitted.
// Only lock and unlock pair exactly. An unlocked range the pool decommits or
// locks may span several commit() calls or be part of one (it joins and cuts
// prewarmed extents, Note [Host pool layout] in pool.h); never more than one
// reserve()d range.
// Calls may block (page faults, driver calls): the pool never makes them while
// holding its lock. One backend per file: backend_cpu_linux.cpp or
// backend_cpu_win.cpp (the build picks the system's), backend_null.cpp,
// backend_cuda.cpp, backend_hip.cpp; backend.cpp picks one (make_backend).
#pragma once

#include <cstddef>
#include <memory>

#include "csrc/pool/options.h"

namespace pins {

class HostBackend {
 public:
  virtual ~HostBackend() = default;
  virtual const char* name() const = 0;
  virtual size_t page_size() const = 0;
  // Whether lock() really page-locks; when false the pool never calls lock().
  virtual bool can_lock() const = 0;
  // Whether a committed range holds bytes a caller may read and write; false
  // for address bookkeeping only (the null backend: its addresses are never
  // mapped).
  virtual bool holds_bytes() const { return true; }
  virtual int reserve(size_t size, void** addr) = 0;
  virtual int release(void* addr, size_t size) = 0;
  virtual int commit(void* addr, size_t size) = 0;
  virtual int decommit(void* addr, size_t size) = 0;
  virtual int lock(void* addr, size_t size) = 0;
  virtual int unlock(void* addr, size_t size) = 0;
};

// The system's virtual memory: mmap, lock() mlock on Linux
// (backend_cpu_linux.cpp); VirtualAlloc, lock() VirtualLock on Windows
// (backend_cpu_win.cpp). Without `use_mlock`, lock() is unavailable.
std::unique_ptr<HostBackend> make_cpu_backend(bool use_mlock);

// Address bookkeeping only: reserve hands out addresses that must never be
// touched, commit and lock do nothing. For the simulator and large-size tests.
// (backend_null.cpp)
std::unique_ptr<HostBackend> make_null_backend();

// Whether this build has the CUDA and the HIP runtime (PINS_WITH_CUDA and
// PINS_WITH_HIP, public definitions of pins_core): an absent device backend is
// then a missing device, not a missing build.
#if defined(PINS_WITH_CUDA)
inline constexpr bool kBuiltWithCuda = true;
#else
inline constexpr bool kBuiltWithCuda = false;
#endif
#if defined(PINS_WITH_HIP)
inline constexpr bool kBuiltWithHip = true;
#else
inline constexpr bool kBuiltWithHip = false;
#endif

// cudaHostRegister on the cpu backend's memory. nullptr when pins was built without
// CUDA or no CUDA device is present. (backend_cuda.cpp)
std::unique_ptr<HostBackend> make_cuda_backend();

// hipHostRegister on mmap-backed memory, for AMD GPUs (ROCm). nullptr when pins
// was built without HIP (PINS_WITH_HIP) or no HIP device is present.
// (backend_hip.cpp)
std::unique_ptr<HostBackend> make_hip_backend();

// The backend `kind` asks for; Auto is cuda when available, else hip when
// available, else cpu. `use_mlock` applies to the cpu backend. Throws
// pins::ValueError when cuda or hip is asked for and unavailable, saying why.
// (backend.cpp)
std::unique_ptr<HostBackend> make_backend(BackendKind kind, bool use_mlock);

}  // namespace pins
