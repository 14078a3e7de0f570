// Backends as only tests build them. Production code never includes this
// header: it gets every backend through backend.h, with its device check.
#pragma once

#include <memory>

#include "csrc/pool/backend.h"

namespace pins::testing {

// The hip backend without make_hip_backend()'s device check, so its contract
// tests run on a machine with no AMD GPU: its mmap layer (reserve, release,
// commit, decommit) works anywhere, lock() fails there. nullptr when pins was
// built without HIP. (backend_hip.cpp)
std::unique_ptr<HostBackend> hip_backend_without_device_check();

}  // namespace pins::testing
