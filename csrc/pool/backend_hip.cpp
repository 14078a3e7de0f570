// The hip backend: hipHostRegister over the cpu backend's memory, the ROCm twin of the
// cuda backend (backend_cuda.cpp), for AMD GPUs. Built without HIP
// (PINS_WITH_HIP unset) it is never available.
//
// Only HIP's host API is used, and that is plain C: the host C++ compiler builds
// this file against HIP's headers with __HIP_PLATFORM_AMD__ (CMakeLists.txt
// says why no hipcc). scripts/check_hip.sh compiles it and runs the backend
// contract tests on it without a device; it has never run on an AMD GPU.
#include "csrc/pool/backend_cpu.h"
#include "csrc/pool/backend_testing.h"

#if defined(PINS_WITH_HIP)

#include <hip/hip_runtime_api.h>

#include <cerrno>

namespace pins {
namespace {

class HipBackend final : public CpuBackend {
 public:
  HipBackend() : CpuBackend(false) {}
  const char* name() const override { return "hip"; }
  bool can_lock() const override { return true; }
  int lock(void* addr, size_t size) override {
    // Portable: the range counts as pinned for every device, not only the current one.
    const hipError_t e = hipHostRegister(addr, size, hipHostRegisterPortable);
    if (e != hipSuccess) {
      (void)hipGetLastError();  // HIP keeps the last error until read; clear it so later calls read clean
      return e == hipErrorOutOfMemory ? ENOMEM : EIO;
    }
    return 0;
  }
  int unlock(void* addr, size_t) override {
    const hipError_t e = hipHostUnregister(addr);
    if (e != hipSuccess) {
      (void)hipGetLastError();
      return EIO;
    }
    return 0;
  }
};

}  // namespace

std::unique_ptr<HostBackend> make_hip_backend() {
  int n = 0;
  if (hipGetDeviceCount(&n) != hipSuccess || n == 0) {
    (void)hipGetLastError();
    return nullptr;
  }
  return std::make_unique<HipBackend>();
}

std::unique_ptr<HostBackend> testing::hip_backend_without_device_check() { return std::make_unique<HipBackend>(); }

}  // namespace pins

#else  // !PINS_WITH_HIP

namespace pins {

std::unique_ptr<HostBackend> make_hip_backend() { return nullptr; }

std::unique_ptr<HostBackend> testing::hip_backend_without_device_check() { return nullptr; }

}  // namespace pins

#endif  // PINS_WITH_HIP
