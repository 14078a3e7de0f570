// What the host pool is built from: the backend kind and the layout sizes. The
// pool knows nothing of PINS_CONF; csrc/config/config.h builds these from the
// configuration in one place (pool_options()).
#pragma once

#include <cstddef>

namespace pins {

// Which HostBackend serves the pool (csrc/pool/backend.h, make_backend).
enum class BackendKind { Auto, Cuda, Hip, Cpu, Null };

const char* to_string(BackendKind k);

// Note [Host pool layout] (csrc/pool/pool.h) says what each size does.
struct PoolOptions {
  size_t segment_size = size_t{1} << 30;  // address space reserved per segment
  size_t extent_min = size_t{2} << 20;    // smallest range committed and locked at once
  size_t alignment = 512;                 // block alignment: a power of two <= the page size
  size_t cap = 0;                         // committed-bytes cap; 0: no cap
  size_t retain_free = size_t{64} << 20;  // idle committed bytes kept for reuse
};

}  // namespace pins
