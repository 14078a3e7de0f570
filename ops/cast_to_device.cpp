// pins::cast_to_device and its out= overload: the cast path of DESIGN.md
// "Choosing and creating a pin".
//
// Note [Cast path]
// model == -1 is a plain copy (counted as `plain_copies`). Otherwise the
// balancer looks the source up (the streaming subset, then an existing -loaded
// pin) or creates a pin within the budget. A cast the balancer does not serve
// through a pin is copied straight from the source and counted under its reason
// (`bypassed.<reason>`, Bypass in csrc/balancer/registry.h): an empty source, a
// refusal of the budget or the pool, a pin busy being filled or evicted by
// another thread, a race with another thread pinning the same source, a model
// forgotten meanwhile, a pin whose page-lock is being dropped. A new pin is
// filled from the source (as raw bytes, in the source's dtype; from its file
// when the source is a mapped file's unwritten bytes, Note [File-backed pins]
// in csrc/files/mapped.h), then the pin is
// copied to the device (non_blocking when asked, with a fence recorded on the
// device's current stream so the pin is neither evicted nor reused until the
// copy is done; the lease, alive until after the fence is recorded, announced
// the copy to the pool: Note [Copies from a block]), and a dtype conversion,
// if any, gives the values `source.to(device).to(dtype)` would: to the CPU in
// the same pass as the copy (the result allocated in the target dtype), to
// another device on the device after the transfer (plain_copy in
// ops/cast_path.h, whose steps this op is). The out= overload writes that same result into the caller's
// tensor, on the current stream: one copy from the pin when no conversion is
// needed or the device is the CPU, else the copy and then the conversion into
// `out`.
//
// Sources: a CPU, strided, non-quantized tensor with a storage; anything else
// is a c10::ValueError naming the argument, as is any other bad argument value
// (Note [Error types] in ops/library.cpp). The result never requires grad: pins
// serves weights for inference. A non-contiguous source is pinned as a
// contiguous copy of its elements (keyed by its layout too), and the result is
// contiguous. A pin serves a cast only while Note [Pin validity]
// (csrc/balancer/registry.h) holds: same storage (held weakly), offset, size,
// layout, version counter where the source has one (inference tensors have
// none: pinned all the same), and the caller's signature; on a hit, Note
// [Content check] (csrc/balancer/content_check.h) compares a few windows of
// the source with the pin. Other writes the version counter does not see are
// the caller's to report (pins::invalidate, a new signature).
#include <pins/ops/cast_to_device.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <type_traits>

#include "csrc/base/nvtx.h"
#include "ops/common.h"
#include "ops/out_tag.h"
#include "ops/cast_path.h"

namespace pins::ops {
namespace {

at::Tensor cast_to_device_kernel(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                                 bool non_blocking, int64_t model, c10::string_view kind, bool resident,
                                 std::optional<int64_t> signature) {
  check_source(source, "cast_to_device", "source");
  const Kind k = check_cast_args("cast_to_device", model, kind);
  // Weights are served for inference: no autograd graph through the pin copies.
  at::NoGradGuard no_grad;
  PINS_RANGE("pins::cast_to_device");
  Lease lease = lease_source(source, model, k, resident, signature, "cast_to_device");
  return cast_through(lease, source, device, dtype, non_blocking);
}

// `device` names `actual`: the same type, and the same index when it has one.
bool names_device(c10::Device device, c10::Device actual) {
  return device.type() == actual.type() && (!device.has_index() || device.index() == actual.index());
}

at::Tensor& cast_to_device_out_kernel(const at::Tensor& source, c10::Device device,
                                      std::optional<c10::ScalarType> dtype, bool non_blocking, int64_t model,
                                      c10::string_view kind, bool resident, std::optional<int64_t> signature,
                                      at::Tensor& out) {
  check_source(source, "cast_to_device", "source");
  const Kind k = check_cast_args("cast_to_device", model, kind);
  TORCH_CHECK_VALUE(out.defined(), "cast_to_device: out is an undefined tensor");
  TORCH_CHECK_VALUE(out.layout() == c10::kStrided, "cast_to_device: out must be a dense (strided) tensor, got layout ",
                    out.layout());
  TORCH_CHECK_VALUE(names_device(device, out.device()), "cast_to_device: out must be on the device ", device,
                    ", got out on ", out.device());
  TORCH_CHECK_VALUE(out.sizes() == source.sizes(), "cast_to_device: out must have the source's shape ", source.sizes(),
                    ", got out of shape ", out.sizes());
  const c10::ScalarType want = dtype.value_or(source.scalar_type());
  TORCH_CHECK_VALUE(out.scalar_type() == want, "cast_to_device: out must have dtype ", want,
                    dtype ? " (the dtype argument)" : " (the source's, no dtype given)", ", got out of dtype ",
                    out.scalar_type());
  at::NoGradGuard no_grad;
  PINS_RANGE("pins::cast_to_device.out");
  Lease lease = lease_source(source, model, k, resident, signature, "cast_to_device");
  cast_through_into(lease, source, out, non_blocking);
  return out;
}

// Not differentiable: below autograd, so the result of a source that requires
// grad (a Parameter) is a plain tensor, not a graph node that cannot backprop.
// One redispatch below ADInplaceOrView (the op is functional), not a new call
// from the top; the guard keeps the kernel's own ops below autograd too.
at::Tensor cast_to_device_autograd(c10::DispatchKeySet ks, const at::Tensor& source, c10::Device device,
                                   std::optional<c10::ScalarType> dtype, bool non_blocking, int64_t model,
                                   c10::string_view kind, bool resident, std::optional<int64_t> signature) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::cast_to_device", "").typed<decltype(cast_to_device)>();
  at::AutoDispatchBelowADInplaceOrView below;
  const c10::DispatchKeySet rest = ks & c10::after_ADInplaceOrView_keyset;
  // The common case, a plain CPU source with no mode or subclass below
  // autograd: the redispatch would land on the kernel itself, so call it (one
  // dispatch per cast, docs/PERFORMANCE.md "cast from Python").
  if (rest.highestPriorityTypeId() == c10::DispatchKey::CPU)
    return cast_to_device_kernel(source, device, dtype, non_blocking, model, kind, resident, signature);
  return op.redispatch(rest, source, device, dtype, non_blocking, model, kind, resident, signature);
}

// The out= overload writes `out`: redispatched below autograd only, so the
// ADInplaceOrView fallthrough stays on the path, and the copy into `out` (run
// without grad mode) bumps out's version counter as any in-place write does.
at::Tensor& cast_to_device_out_autograd(c10::DispatchKeySet ks, const at::Tensor& source, c10::Device device,
                                        std::optional<c10::ScalarType> dtype, bool non_blocking, int64_t model,
                                        c10::string_view kind, bool resident, std::optional<int64_t> signature,
                                        at::Tensor& out) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pins::cast_to_device", "out")
                       .typed<decltype(cast_to_device_outf)>();
  return op.redispatch(ks & c10::after_autograd_keyset, source, device, dtype, non_blocking, model, kind, resident,
                       signature, out);
}

// The kernels take exactly the entry points' (the schemas') C++ types.
static_assert(std::is_same_v<decltype(cast_to_device_kernel), decltype(cast_to_device)>);
static_assert(std::is_same_v<decltype(cast_to_device_autograd), with_keyset_t<decltype(cast_to_device)>>);
static_assert(std::is_same_v<decltype(cast_to_device_out_kernel), decltype(cast_to_device_outf)>);
static_assert(std::is_same_v<decltype(cast_to_device_out_autograd), with_keyset_t<decltype(cast_to_device_outf)>>);

}  // namespace

at::Tensor cast_to_device(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                          bool non_blocking, int64_t model, c10::string_view kind, bool resident,
                          std::optional<int64_t> signature) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::cast_to_device", "").typed<decltype(cast_to_device)>();
  return op.call(source, device, dtype, non_blocking, model, kind, resident, signature);
}

at::Tensor& cast_to_device_outf(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                                bool non_blocking, int64_t model, c10::string_view kind, bool resident,
                                std::optional<int64_t> signature, at::Tensor& out) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pins::cast_to_device", "out")
                       .typed<decltype(cast_to_device_outf)>();
  return op.call(source, device, dtype, non_blocking, model, kind, resident, signature, out);
}

at::Tensor& cast_to_device_out(at::Tensor& out, const at::Tensor& source, c10::Device device,
                               std::optional<c10::ScalarType> dtype, bool non_blocking, int64_t model,
                               c10::string_view kind, bool resident, std::optional<int64_t> signature) {
  return cast_to_device_outf(source, device, dtype, non_blocking, model, kind, resident, signature, out);
}

}  // namespace pins::ops

// Note [Casts under inductor]
// Inductor (torch 2.13, 2.14) lowers a call of a single-output functional
// custom op to its Tag.out overload, so that it writes into a buffer inductor
// plans. Its generated call passes every non-tensor argument positionally and
// then, again, those it holds as keywords; it holds the trailing defaults a
// call left out as keywords when it normalizes the call against the schema,
// which it does for the default layout constraint of a custom op
// (needs_exact_strides: the inputs get eager's strides). So the lowered
// cast_to_device.out got kind, resident and signature twice and failed. The
// cast reads a source of any strides and its result does not depend on them:
// flexible_layout says so, inductor then takes the call as the graph holds it
// (the dispatcher records the arguments positionally), and the lowered call is
// right. cast_many_to_device (no out= overload) says the same for the same
// reason. tests/python/test_compile.py compiles every cast op with inductor.
TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def(
      "cast_to_device(Tensor source, Device device, ScalarType? dtype=None, bool non_blocking=False, "
      "int model=-1, str kind=\"weights\", bool resident=False, int? signature=None) -> Tensor",
      {at::Tag::flexible_layout});
  // An out variant (torch.Tag.out, out_variant before it): torch.compile functionalizes it.
  m.def(
      "cast_to_device.out(Tensor source, Device device, ScalarType? dtype=None, bool non_blocking=False, "
      "int model=-1, str kind=\"weights\", bool resident=False, int? signature=None, *, Tensor(a!) out) "
      "-> Tensor(a!)",
      {pins::ops::out_tag()});
}

// One kernel for every backend: the source's device is checked in the kernel,
// so a wrong-device source gets an error naming it instead of a missing-kernel
// error. The fake kernels for tracing are in python_bindings/torch_pins/_fake.py.
TORCH_LIBRARY_IMPL(pins, CompositeExplicitAutograd, m) {
  m.impl("cast_to_device", &pins::ops::cast_to_device_kernel);
  m.impl("cast_to_device.out", &pins::ops::cast_to_device_out_kernel);
}

TORCH_LIBRARY_IMPL(pins, Autograd, m) {
  m.impl("cast_to_device", &pins::ops::cast_to_device_autograd);
  m.impl("cast_to_device.out", &pins::ops::cast_to_device_out_autograd);
}
