// The c10::Allocator adapter over the process-wide host pool
// (Runtime::get().pool(), csrc/runtime/runtime.h), so that a pin is an ordinary
// CPU tensor (and is_pinned() on a CUDA machine), and the c10::Event fence that
// protects a pin while a copy from it is in flight.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

#include "csrc/pool/pool.h"

namespace pins {

class TorchHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
};

// The process-wide runtime's pool, for what torch writes into: a c10::ValueError
// naming PINS_CONF's `backend` when it holds no bytes (backend:null keeps
// address bookkeeping only: a copy into one of its blocks would fault).
// Building the runtime on first use, a bad PINS_CONF is a c10::ValueError too.
HostPool& torch_pool();

// The process-wide adapter (over torch_pool()).
TorchHostAllocator& torch_host_allocator();

// An empty CPU tensor whose storage is a pool block; undefined when the pool
// refuses (try_allocate semantics). `lock`: page-locked when the backend can.
at::Tensor try_empty_pinned(c10::IntArrayRef sizes, c10::ScalarType dtype, bool lock = true);

// Records an event on `stream` against the pool block behind `data`, which must
// come from the process-wide pool: the block is not reused until the stream passes it.
void record_stream(const void* data, c10::Stream stream);

}  // namespace pins
