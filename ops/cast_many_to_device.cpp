// pins::cast_many_to_device: several sources (a module's weight and bias) in one
// pin and one transfer.
//
// Note [Gathered pins]
// The sources are laid out one after another in one block, each at an offset
// aligned to kPartAlignment (empty sources take no room), in their own dtypes
// and as contiguous copies. The block is one pin of the balancer, keyed by the
// whole group: the first source's storage and offset, the block's size, and a
// hash of every source's identity as its layout, made even and non-zero so that
// it never equals a single source's layout (0 or odd). The pin keeps every
// source's identity (SourcePart) too, so a collision of two groups' keys makes
// the other group re-pinned, never served; each part is checked as a single
// source is (Note [Pin validity]): one stale part makes the group stale, and
// invalidate() on any part's bytes drops the group. The block goes to the device
// in one copy, into one buffer. The results of a custom op may not share a
// storage (torch.compile checks it, and fails in CI mode), so one result stays
// a view of that buffer: the first, at its start, when it needs no conversion
// (pass the largest source first). Every other part is copied out of it on the
// device into its own tensor, converted to `dtype` on the way when given (the
// conversion of cast_to_device, Note [Cast path]); for a weight and its bias
// that is the bias alone. A cast the
// balancer does not serve through a pin (model -1, or a Bypass reason) copies
// each source into its place in the buffer instead. With a conversion to the
// CPU no result keeps the buffer, so there is none: each result is made in one
// pass from its part of the pin (or its source). A hit, a miss and a bypass
// count once per group.
#include <pins/ops/cast_many_to_device.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <type_traits>
#include <vector>

#include "csrc/base/nvtx.h"
#include "ops/common.h"
#include "ops/cast_path.h"

namespace pins::ops {
namespace {

// The offset of every part of a block (enough for any dtype's alignment and the
// device's vectorized loads; the pool's own block alignment).
constexpr uint64_t kPartAlignment = 512;

uint64_t align_up(uint64_t n) {
  return (n + kPartAlignment - 1) / kPartAlignment * kPartAlignment;
}

// Offsets of parts of `bytes` each, laid out in order; returns the block size.
uint64_t lay_out(const std::vector<uint64_t>& bytes, std::vector<uint64_t>& offsets) {
  uint64_t end = 0;
  offsets.clear();
  for (uint64_t b : bytes) {
    const uint64_t at = b == 0 ? 0 : align_up(end);
    offsets.push_back(at);
    if (b != 0) end = at + b;
  }
  return end;
}

// A contiguous tensor of `sizes` and `dtype` over `buffer`'s storage at byte `offset`.
at::Tensor view_at(const at::Tensor& buffer, uint64_t offset, c10::IntArrayRef sizes, c10::ScalarType dtype) {
  const int64_t el = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  return at::empty({0}, buffer.options().dtype(dtype))
      .set_(buffer.storage(), static_cast<int64_t>(offset) / el, sizes, strides);
}

PinKey group_key(const std::vector<SourcePart>& parts, uint64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(parts.size());
  for (const SourcePart& p : parts) {
    mix(p.key.storage);
    mix(p.key.offset);
    mix(p.key.nbytes);
    mix(p.key.layout);
  }
  h <<= 1;  // even: a single source's layout is 0 or odd
  return PinKey{parts[0].key.storage, parts[0].key.offset, bytes, h != 0 ? h : 2};
}

std::vector<at::Tensor> cast_many_to_device_kernel(at::TensorList sources, c10::Device device,
                                                   std::optional<c10::ScalarType> dtype, bool non_blocking,
                                                   int64_t model, c10::string_view kind, bool resident,
                                                   std::optional<int64_t> signature) {
  for (size_t i = 0; i < sources.size(); ++i) {
    TORCH_CHECK_VALUE(sources[i].defined(), "cast_many_to_device: sources[", i,
                      "] is an undefined tensor (None is not allowed in sources)");
    check_source(sources[i], "cast_many_to_device", "sources[" + std::to_string(i) + "]");
  }
  const Kind k = check_cast_args("cast_many_to_device", model, kind);
  at::NoGradGuard no_grad;
  if (sources.empty()) return {};
  PINS_RANGE("pins::cast_many_to_device");

  std::vector<SourcePart> parts;
  std::vector<uint64_t> bytes, offsets;
  for (const at::Tensor& s : sources) {
    parts.push_back(source_part(s));
    bytes.push_back(parts.back().key.nbytes);
  }
  const uint64_t total = lay_out(bytes, offsets);

  Request r;
  r.op = "cast_many_to_device";
  r.model = model;
  r.key = group_key(parts, total);
  r.bytes = total;  // 0 (every source empty): counted as Bypass::Empty
  r.kind = k;
  r.resident = resident;
  r.signature = signature;
  r.parts = parts;
  Lease lease = lease_pin(r, sources);
  if (!lease)
    for (const at::Tensor& s : sources) check_source_readable(s);  // read below through memory
  // Note [Gathered pins]: the first result keeps the transfer's buffer when it
  // needs no conversion; the others get their own storage on the device.
  const bool keep_first = !dtype || *dtype == sources[0].scalar_type();
  if (device.is_cpu() && !keep_first) {
    // A conversion to the CPU: no result can keep a transferred buffer, so no
    // transfer; each result in one pass from its part of the pin (or its
    // source), converted as it is copied.
    if (lease && lease.needs_fill()) {
      PINS_RANGE("pins::fill");
      for (size_t i = 0; i < sources.size(); ++i)
        if (bytes[i] != 0) fill_pin(pin_view(lease, offsets[i], sources[i]), sources[i]);
      lease.filled();
    }
    std::vector<at::Tensor> out;
    out.reserve(sources.size());
    for (size_t i = 0; i < sources.size(); ++i) {
      const at::Tensor from = lease && bytes[i] != 0 ? pin_view(lease, offsets[i], sources[i]) : sources[i];
      out.push_back(plain_copy(from, device, dtype, non_blocking));
    }
    return out;
  }

  // One buffer on the device for every part, in the sources' dtypes.
  at::Tensor staged =
      at::empty({static_cast<int64_t>(total)},
                sources[0].options().dtype(at::kByte).device(device).memory_format(at::MemoryFormat::Contiguous));
  if (lease) {
    if (lease.needs_fill()) {
      PINS_RANGE("pins::fill");
      for (size_t i = 0; i < sources.size(); ++i)
        if (bytes[i] != 0) fill_pin(pin_view(lease, offsets[i], sources[i]), sources[i]);
      lease.filled();
    }
    staged.copy_(at::from_blob(lease.data(), {static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte)),
                 non_blocking);
    fence(lease, staged.device(), non_blocking);
  } else {
    for (size_t i = 0; i < sources.size(); ++i)
      if (bytes[i] != 0)
        view_at(staged, offsets[i], sources[i].sizes(), sources[i].scalar_type()).copy_(sources[i], non_blocking);
  }

  std::vector<at::Tensor> out;
  out.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor part = view_at(staged, offsets[i], sources[i].sizes(), sources[i].scalar_type());
    if (i == 0 && keep_first) {
      out.push_back(part);
      continue;
    }
    at::Tensor own = at::empty(sources[i].sizes(), staged.options().dtype(dtype.value_or(sources[i].scalar_type())));
    own.copy_(part);  // on the device: a copy, or the conversion of cast_to_device (Note [Cast path])
    out.push_back(std::move(own));
  }
  return out;
}

// Not differentiable, as cast_to_device (Note [Cast path]): one redispatch below
// ADInplaceOrView.
std::vector<at::Tensor> cast_many_to_device_autograd(c10::DispatchKeySet ks, at::TensorList sources, c10::Device device,
                                                     std::optional<c10::ScalarType> dtype, bool non_blocking,
                                                     int64_t model, c10::string_view kind, bool resident,
                                                     std::optional<int64_t> signature) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pins::cast_many_to_device", "")
                       .typed<decltype(cast_many_to_device)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.redispatch(ks & c10::after_ADInplaceOrView_keyset, sources, device, dtype, non_blocking, model, kind,
                       resident, signature);
}

static_assert(std::is_same_v<decltype(cast_many_to_device_kernel), decltype(cast_many_to_device)>);
static_assert(std::is_same_v<decltype(cast_many_to_device_autograd), with_keyset_t<decltype(cast_many_to_device)>>);

}  // namespace

std::vector<at::Tensor> cast_many_to_device(at::TensorList sources, c10::Device device,
                                            std::optional<c10::ScalarType> dtype, bool non_blocking, int64_t model,
                                            c10::string_view kind, bool resident, std::optional<int64_t> signature) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pins::cast_many_to_device", "")
                       .typed<decltype(cast_many_to_device)>();
  return op.call(sources, device, dtype, non_blocking, model, kind, resident, signature);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def(
      "cast_many_to_device(Tensor[] sources, Device device, ScalarType? dtype=None, bool non_blocking=False, "
      "int model=-1, str kind=\"weights\", bool resident=False, int? signature=None) -> Tensor[]",
      // Any strides in, results that do not depend on them: Note [Casts under
      // inductor] in ops/cast_to_device.cpp.
      {at::Tag::flexible_layout});
}

TORCH_LIBRARY_IMPL(pins, CompositeExplicitAutograd, m) {
  m.impl("cast_many_to_device", &pins::ops::cast_many_to_device_kernel);
}

TORCH_LIBRARY_IMPL(pins, Autograd, m) {
  m.impl("cast_many_to_device", &pins::ops::cast_many_to_device_autograd);
}
