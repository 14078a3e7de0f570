// pins::cast_to_device: the cast path of DESIGN.md "Choosing and creating a pin".
//
// Note [Cast path]
// model == -1 is a plain copy. Otherwise the balancer looks the source up (the
// streaming subset, then an existing -loaded pin) or creates a pin within the
// budget; a refused or busy pin means a direct copy from the source. A new pin
// is filled from the source (as raw bytes, in the source's dtype), then the pin
// is copied to the device (non_blocking when asked, with a fence recorded on the
// device's current stream so the pin is neither evicted nor reused until the copy
// is done), and a dtype conversion, if any, runs on the copy, exactly as
// `source.to(device).to(dtype)` would.
//
// Sources: a CPU, strided, non-quantized tensor; anything else is a
// c10::ValueError naming the argument, as is any other bad argument value (Note
// [Error types] in ops/library.cpp). The result never requires grad: pins
// serves weights for inference. A non-contiguous source is pinned as a
// contiguous copy of its elements (keyed by its layout too), and the result is
// contiguous. A pin is tied to its source's storage through a weak
// reference and to its version counter, so a source that died or was written
// in place is re-pinned, never served stale. Inference tensors have no version
// counter: they are copied directly, never pinned.
#include <pins/ops/cast_to_device.h>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/library.h>

#include <type_traits>

#include "csrc/base/nvtx.h"
#include "ops/allocator/torch_allocator.h"
#include "ops/common.h"

namespace pins::ops {
namespace {

class StorageGuard final : public SourceGuard {
 public:
  explicit StorageGuard(const c10::Storage& s) : weak_(s.getWeakStorageImpl()) {}
  bool alive() const override { return !weak_.expired(); }

 private:
  c10::weak_intrusive_ptr<c10::StorageImpl> weak_;
};

uint64_t layout_hash(const at::Tensor& t) {
  if (t.is_contiguous()) return 0;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  for (int64_t s : t.sizes()) mix(s);
  for (int64_t s : t.strides()) mix(s);
  return h | 1;
}

at::Tensor plain_copy(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                      bool non_blocking) {
  at::Tensor out =
      at::empty(source.sizes(), source.options().device(device).memory_format(at::MemoryFormat::Contiguous));
  out.copy_(source, non_blocking);
  return dtype && *dtype != source.scalar_type() ? out.to(*dtype) : out;
}

at::Tensor cast_to_device_kernel(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                                 bool non_blocking, int64_t model, c10::string_view kind, bool resident,
                                 std::optional<int64_t> signature) {
  TORCH_CHECK_VALUE(source.defined(), "cast_to_device: source is an undefined tensor");
  // Weights are served for inference: no autograd graph through the pin copies.
  at::NoGradGuard no_grad;
  TORCH_CHECK_VALUE(source.layout() == c10::kStrided,
                    "cast_to_device: source must be a dense (strided) tensor, got layout ", source.layout());
  TORCH_CHECK_VALUE(!source.is_quantized(), "cast_to_device: source must not be quantized, got dtype ",
                    source.scalar_type());
  TORCH_CHECK_VALUE(source.device().is_cpu(), "cast_to_device: source must be a CPU tensor, got device ",
                    source.device());
  Kind k;
  if (kind == "weights") {
    k = Kind::Weights;
  } else if (kind == "patches") {
    k = Kind::Patches;
  } else {
    TORCH_CHECK_VALUE(false, "cast_to_device: kind must be 'weights' or 'patches', got '", kind, "'");
  }
  TORCH_CHECK_VALUE(!signature || k == Kind::Patches,
                    "cast_to_device: signature identifies a patch set and needs kind='patches', got kind='weights' "
                    "with signature ",
                    *signature);
  TORCH_CHECK_VALUE(model >= -1, "cast_to_device: model must be a registered model id or -1, got ", model);
  if (model == -1) return plain_copy(source, device, dtype, non_blocking);

  PINS_RANGE("pins::cast_to_device");
  Balancer& bal = balancer();
  TORCH_CHECK_VALUE(bal.has_model(model), "cast_to_device: model ", model, " is not registered");
  const size_t nbytes = static_cast<size_t>(source.numel()) * source.element_size();
  if (nbytes == 0 || source.is_inference()) return plain_copy(source, device, dtype, non_blocking);

  Request r;
  r.model = model;
  r.key = PinKey{reinterpret_cast<uint64_t>(source.storage().unsafeGetStorageImpl()),
                 static_cast<uint64_t>(source.storage_offset()) * source.element_size(), nbytes, layout_hash(source)};
  r.bytes = nbytes;
  r.kind = k;
  r.resident = resident;
  r.signature = signature;
  r.version = source._version();
  Lease lease =
      translate([&] { return bal.acquire(r, [&] { return std::make_unique<StorageGuard>(source.storage()); }); });
  if (!lease) return plain_copy(source, device, dtype, non_blocking);

  at::Tensor pin =
      at::from_blob(lease.data(), source.sizes(), source.options().memory_format(at::MemoryFormat::Contiguous));
  if (lease.needs_fill()) {
    PINS_RANGE("pins::fill");
    pin.copy_(source);
    lease.filled();
  }
  at::Tensor out = plain_copy(pin, device, dtype, non_blocking);
  if (non_blocking && !out.device().is_cpu()) {
    // The copy (and the conversion after it, on the same stream) may still be
    // reading the pin when we return: fence it.
    const c10::Stream stream = c10::impl::VirtualGuardImpl(out.device().type()).getStream(out.device());
    record_stream(lease.data(), stream);
  }
  return out;
}

// Not differentiable: below autograd, so the result of a source that requires
// grad (a Parameter) is a plain tensor, not a graph node that cannot backprop.
at::Tensor cast_to_device_autograd(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                                   bool non_blocking, int64_t model, c10::string_view kind, bool resident,
                                   std::optional<int64_t> signature) {
  at::AutoDispatchBelowADInplaceOrView below;
  return cast_to_device(source, device, dtype, non_blocking, model, kind, resident, signature);
}

// The kernels take exactly the entry point's (the schema's) C++ types.
static_assert(std::is_same_v<decltype(cast_to_device_kernel), decltype(cast_to_device)>);
static_assert(std::is_same_v<decltype(cast_to_device_autograd), decltype(cast_to_device)>);

}  // namespace

at::Tensor cast_to_device(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                          bool non_blocking, int64_t model, c10::string_view kind, bool resident,
                          std::optional<int64_t> signature) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::cast_to_device", "").typed<decltype(cast_to_device)>();
  return op.call(source, device, dtype, non_blocking, model, kind, resident, signature);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def(
      "cast_to_device(Tensor source, Device device, ScalarType? dtype=None, bool non_blocking=False, "
      "int model=-1, str kind=\"weights\", bool resident=False, int? signature=None) -> Tensor");
}

// One kernel for every backend: the source's device is checked in the kernel,
// so a wrong-device source gets an error naming it instead of a missing-kernel
// error. The fake kernel for tracing is in python_bindings/torch_pins/_fake.py.
TORCH_LIBRARY_IMPL(pins, CompositeExplicitAutograd, m) {
  m.impl("cast_to_device", &pins::ops::cast_to_device_kernel);
}

TORCH_LIBRARY_IMPL(pins, Autograd, m) {
  m.impl("cast_to_device", &pins::ops::cast_to_device_autograd);
}
