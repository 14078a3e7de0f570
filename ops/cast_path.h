// What the cast ops (cast_to_device, its out= overload, cast_many_to_device) and
// invalidate share: the checks on a source, its identity as the balancer sees it
// (Note [Pin validity] in csrc/balancer/registry.h), the weak guard on its
// storage, and the copy from a pin (or the source) to the device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "csrc/balancer/balancer.h"

namespace pins::ops {

// Checks that `t` can be a pin's source: defined, dense (strided), not
// quantized, on the CPU, with a storage. A c10::ValueError names `op`,
// `argument` ("source", "sources[2]") and what it got.
void check_source(const at::Tensor& t, const char* op, const std::string& argument);

// Checks model and kind (and returns the kind) for the cast ops.
Kind check_cast_args(const char* op, int64_t model, c10::string_view kind);

// The source's identity: storage, byte offset, size, layout (0 when
// contiguous), the bytes of its storage it reaches, and its version counter
// (none for an inference tensor).
SourcePart source_part(const at::Tensor& t);

// A weak hold on the storages of a pin's sources: alive while every one is.
std::unique_ptr<SourceGuard> storage_guard(const std::vector<at::Tensor>& sources);

// `source` copied to `device` (non_blocking when asked) and converted to
// `dtype`, with the values of source.to(device).to(dtype); a new contiguous
// tensor. To the CPU, and without a conversion, one pass into the result; to
// another device with a conversion, the bytes are transferred as they are and
// converted on the device.
at::Tensor plain_copy(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                      bool non_blocking);

// A contiguous CPU tensor over a pin's bytes at `offset`: the same shape and
// dtype as `like`.
at::Tensor pin_view(const Lease& lease, uint64_t offset, const at::Tensor& like);

// Fills `pin` (a pin_view) with `source`'s bytes: from the file the source is
// mapped from, where Note [File-backed pins] (csrc/files/mapped.h) allows it,
// else copied from memory. A read error is a c10::Error naming the file.
void fill_pin(const at::Tensor& pin, const at::Tensor& source);

// Note [Chunked fill]
// A miss fills its new pin from the source and copies the pin to the result.
// To a device, done whole, the transfer waits for the whole fill; from a source
// in memory (not a file, Note [File-backed pins]) the two go in 4 MiB chunks
// instead, the transfer of one chunk running while the next is copied into the
// pin, so a miss costs about the longer of the two rather than their sum. To
// the CPU the fill and the copy stay whole: done in chunks (256 KiB, each
// converted while still in the cache) a 32 MiB fp16 -> bf16 miss took
// 1.24-1.31x a plain .to() against 1.14-1.21x whole (docs/PERFORMANCE.md, "a
// miss"): torch's copy_ spreads a whole tensor over its threads and sets up
// once. The result and the pin hold the same bytes as a whole fill and a
// plain_copy() from the pin would give. Both run under the "pins::fill" range.
//
// `source` into `pin` (a pin_view of a new lease), and the result as
// plain_copy(pin, device, dtype, non_blocking) would return it.
at::Tensor fill_and_copy(const at::Tensor& pin, const at::Tensor& source, c10::Device device,
                         std::optional<c10::ScalarType> dtype, bool non_blocking);
// The same into `out` (the source's shape; on a device the source's dtype, on
// the CPU any: the copy converts), as the out= overload copies from a pin.
void fill_and_copy_into(const at::Tensor& pin, const at::Tensor& source, const at::Tensor& out, bool non_blocking);
// The chunks themselves: contiguous `source` into `pin` and on into `staged`
// (contiguous, the source's shape and dtype; the CPU too, for tests), chunks of
// `chunk_bytes` rounded down to whole elements (at least one). Each transfer is
// queued on the device's current stream without waiting, so it runs while the
// next chunk is copied into the pin; unless `non_blocking`, the stream is
// waited for at the end, as a blocking copy_ would.
void fill_in_chunks(const at::Tensor& pin, const at::Tensor& source, const at::Tensor& staged, bool non_blocking,
                    int64_t chunk_bytes);

// Fences the pin behind `lease` against the copies just queued on `device`'s
// current stream (non_blocking copies to a non-CPU device only): it is neither
// evicted nor reused until the stream passes them.
void fence(const Lease& lease, c10::Device device, bool non_blocking);

}  // namespace pins::ops
