// The cuda backend: cudaHostRegister over the cpu backend's memory, reserved
// and committed like cpu memory, page-locked by the driver so copies to the
// device are DMA, not staged. Built without CUDA (PINS_WITH_CUDA unset) it is never available.
#include "csrc/pool/backend_cpu.h"

#if defined(PINS_WITH_CUDA)

#include <cuda_runtime_api.h>

#include <cerrno>

namespace pins {
namespace {

class CudaBackend final : public CpuBackend {
 public:
  CudaBackend() : CpuBackend(false) {}
  const char* name() const override { return "cuda"; }
  bool can_lock() const override { return true; }
  int lock(void* addr, size_t size) override {
    // Portable: the range counts as pinned in every CUDA context, not only this one.
    const cudaError_t e = cudaHostRegister(addr, size, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls are clean
      return e == cudaErrorMemoryAllocation ? ENOMEM : EIO;
    }
    return 0;
  }
  int unlock(void* addr, size_t) override {
    const cudaError_t e = cudaHostUnregister(addr);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return EIO;
    }
    return 0;
  }
};

}  // namespace

std::unique_ptr<HostBackend> make_cuda_backend() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<CudaBackend>();
}

}  // namespace pins

#else  // !PINS_WITH_CUDA

namespace pins {

std::unique_ptr<HostBackend> make_cuda_backend() { return nullptr; }

}  // namespace pins

#endif  // PINS_WITH_CUDA
