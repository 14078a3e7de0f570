// Picks the backend a BackendKind names; each backend lives in its own file.
#include "csrc/pool/backend.h"

#include "csrc/base/check.h"

namespace pins {
namespace {

#if defined(PINS_WITH_CUDA)
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

}  // namespace

const char* to_string(BackendKind k) {
  switch (k) {
    case BackendKind::Auto: return "auto";
    case BackendKind::Cuda: return "cuda";
    case BackendKind::Cpu: return "cpu";
    case BackendKind::Null: return "null";
  }
  return "?";
}

std::unique_ptr<HostBackend> make_backend(BackendKind kind, bool use_mlock) {
  switch (kind) {
    case BackendKind::Null:
      return make_null_backend();
    case BackendKind::Cpu:
      return make_cpu_backend(use_mlock);
    case BackendKind::Cuda: {
      auto b = make_cuda_backend();
      PINS_CHECK_VALUE(b != nullptr, "PINS_CONF backend:cuda was asked for, but ",
                       kBuiltWithCuda ? "no CUDA device is present" : "pins was built without CUDA");
      return b;
    }
    case BackendKind::Auto:
      break;
  }
  if (auto b = make_cuda_backend()) return b;
  return make_cpu_backend(use_mlock);
}

}  // namespace pins
