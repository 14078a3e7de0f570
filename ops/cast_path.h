// The cast path from a source to the device, in the order its data flows: the
// checks on the arguments, the source's identity and the lease of its pin, the
// fill of a new pin, the transfer to the device (with the conversion), and the
// fence that keeps the pin until the transfer is done. cast_to_device (and its
// out= overload) and cast_many_to_device are these steps; invalidate uses the
// first two. Note [Cast path] in ops/cast_to_device.cpp says what a cast does.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "csrc/balancer/balancer.h"

namespace pins::ops {

// ---- 1. validate

// Checks that `t` can be a pin's source: defined, dense (strided), not
// quantized, on the CPU, with a storage. A c10::ValueError names `op`,
// `argument` ("source", "sources[2]") and what it got.
void check_source(const at::Tensor& t, const char* op, const std::string& argument);

// Checks model and kind (and returns the kind) for the cast ops.
Kind check_cast_args(const char* op, int64_t model, c10::string_view kind);

// ---- 2. identify, lease

// The source's identity: storage, byte offset, size, layout (0 when
// contiguous), the bytes of its storage it reaches, and its version counter
// (none for an inference tensor).
SourcePart source_part(const at::Tensor& t);

// The request for one source's pin (Note [Pin validity]).
Request source_request(const at::Tensor& source, int64_t model, Kind kind, bool resident,
                       std::optional<int64_t> signature, const char* op);

// The lease of `r`, a request for the pin of `sources` (one source, or a
// gathered group), or an empty one (copy from the sources): model -1 is a plain
// copy by request, counted once per source; otherwise the balancer leases the
// pin, making it within the budget, or serves the cast from the sources and
// counts why. A model that is not registered is a c10::ValueError naming r.op.
Lease lease_pin(const Request& r, c10::ArrayRef<at::Tensor> sources);
// lease_pin(source_request(...), source) for one source; a plain copy by
// request (model -1) does not read the source's identity.
Lease lease_source(const at::Tensor& source, int64_t model, Kind kind, bool resident,
                   std::optional<int64_t> signature, const char* op);

// Before a read of `source` itself (not of a pin): Note [Truncated mappings]
// (csrc/files/mapped.h). A c10::Error naming the file when a file pins mapped
// no longer holds the source's bytes.
void check_source_readable(const at::Tensor& source);

// ---- 3. fill

// A contiguous CPU tensor over a pin's bytes at `offset`: the same shape and
// dtype as `like`.
at::Tensor pin_view(const Lease& lease, uint64_t offset, const at::Tensor& like);

// Fills `pin` (a pin_view) with `source`'s bytes: from the file the source is
// mapped from, where Note [File-backed pins] (csrc/files/mapped.h) allows it,
// else copied from memory. A read error is a c10::Error naming the file.
void fill_pin(const at::Tensor& pin, const at::Tensor& source);
// Note [Shared pins]: fills `pin` from the file when the lease's pin is
// shared (Lease::shared_fill) and returns true; false, nothing done, otherwise.
bool fill_shared_pin(const Lease& lease, const at::Tensor& pin, const at::Tensor& source);

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
// The chunks themselves: contiguous `source` into `pin` and on into `staged`
// (contiguous, the source's shape and dtype; the CPU too, for tests), chunks of
// `chunk_bytes` rounded down to whole elements (at least one). Each transfer is
// queued on the device's current stream without waiting, so it runs while the
// next chunk is copied into the pin; unless `non_blocking`, the stream is
// waited for at the end, as a blocking copy_ would.
void fill_in_chunks(const at::Tensor& pin, const at::Tensor& source, const at::Tensor& staged, bool non_blocking,
                    int64_t chunk_bytes);

// ---- 4. transfer

// `source` copied to `device` (non_blocking when asked) and converted to
// `dtype`, with the values of source.to(device).to(dtype); a new contiguous
// tensor. To the CPU, and without a conversion, one pass into the result; to
// another device with a conversion, the bytes are transferred as they are and
// converted on the device.
at::Tensor plain_copy(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                      bool non_blocking);

// Steps 3 to 5 for one source: the result of casting `source` through `lease`
// (its pin filled first when new, in chunks where Note [Chunked fill] says so,
// then marked filled; the fence recorded after the transfer), or straight from
// the source when the lease is empty; the values of plain_copy(source, ...).
at::Tensor cast_through(Lease& lease, const at::Tensor& source, c10::Device device,
                        std::optional<c10::ScalarType> dtype, bool non_blocking);
// The same into `out` (the source's shape; on a device the dtype asked, on the
// CPU any: the copy converts), as the out= overload writes it.
void cast_through_into(Lease& lease, const at::Tensor& source, const at::Tensor& out, bool non_blocking);

// ---- 5. fence

// Fences the pin behind `lease` against the copies just queued on `device`'s
// current stream (non_blocking copies to a non-CPU device only): it is neither
// evicted nor reused until the stream passes them.
void fence(const Lease& lease, c10::Device device, bool non_blocking);

}  // namespace pins::ops
