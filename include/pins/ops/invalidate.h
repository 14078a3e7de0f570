// pins::invalidate, pins::invalidate_model (ops/invalidate.cpp):
// writes the version counter cannot see (Note [Pin validity]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include <pins/export.h>

namespace pins::ops {

// Drops every pin (of any model and subset, gathered pins included) with
// source bytes that overlap `source`'s bytes in its storage, and returns the
// bytes dropped. Call it after writing a source in a way its version counter
// does not see (through .data, a numpy alias, set_(), untyped_storage().copy_(),
// any in-place write to an inference tensor, a file rewritten under an mmap). A
// leased pin, or one with a copy in flight, is detached and freed when
// released, never served again. `source` must be a CPU, dense, non-quantized
// tensor (else a c10::ValueError naming it).
PINS_API int64_t invalidate(const at::Tensor& source);

// Drops every pin of `model` (which stays registered) and returns the bytes
// dropped. An id that names no registered model is a c10::ValueError.
PINS_API int64_t invalidate_model(int64_t model);

}  // namespace pins::ops
