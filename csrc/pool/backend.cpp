// Picks the backend a BackendKind names; each backend lives in its own file.
#include "csrc/pool/backend.h"

#include "csrc/base/check.h"

namespace pins {
namespace {

// A device backend the configuration names: when it is absent, the error says
// whether this build lacks the runtime or this machine lacks the device.
std::unique_ptr<HostBackend> required(std::unique_ptr<HostBackend> b, const char* name, const char* runtime,
                                      bool built) {
  PINS_CHECK_VALUE(b != nullptr, "PINS_CONF backend:", name, " was asked for, but ",
                   built ? "no " : "pins was built without ", runtime, built ? " device is present" : "");
  return b;
}

}  // namespace

const char* to_string(BackendKind k) {
  switch (k) {
    case BackendKind::Auto: return "auto";
    case BackendKind::Cuda: return "cuda";
    case BackendKind::Hip: return "hip";
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
    case BackendKind::Cuda:
      return required(make_cuda_backend(), "cuda", "CUDA", kBuiltWithCuda);
    case BackendKind::Hip:
      return required(make_hip_backend(), "hip", "HIP", kBuiltWithHip);
    case BackendKind::Auto:
      break;
  }
  // A machine has NVIDIA or AMD GPUs, rarely both; cuda first, as before hip existed.
  if (auto b = make_cuda_backend()) return b;
  if (auto b = make_hip_backend()) return b;
  return make_cpu_backend(use_mlock);
}

}  // namespace pins
