#include "csrc/pool/backend.h"

#include "csrc/base/check.h"

namespace pins {

std::unique_ptr<HostBackend> make_backend(BackendKind kind, bool use_mlock) {
  switch (kind) {
    case BackendKind::Null:
      return make_null_backend();
    case BackendKind::Cpu:
      return make_cpu_backend(use_mlock);
    case BackendKind::Cuda: {
      auto b = make_cuda_backend();
      PINS_CHECK_VALUE(b != nullptr, "PINS_CONF backend:cuda was asked for, but ",
#if defined(PINS_WITH_CUDA)
                       "no CUDA device is present"
#else
                       "pins was built without CUDA"
#endif
      );
      return b;
    }
    case BackendKind::Auto:
      break;
  }
  if (auto b = make_cuda_backend()) return b;
  return make_cpu_backend(use_mlock);
}

}  // namespace pins
