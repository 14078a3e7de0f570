// pins::invalidate and pins::invalidate_model: drop pins whose sources the
// caller rewrote where no version counter sees it (Note [Pin validity] in
// csrc/balancer/registry.h; the lookup is Note [Source index]).
#include <pins/ops/invalidate.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <type_traits>

#include "ops/common.h"
#include "ops/cast_path.h"

namespace pins::ops {
namespace {

int64_t invalidate_kernel(const at::Tensor& source) {
  check_source(source, "invalidate", "source");
  const SourcePart part = source_part(source);
  return translate(
      [&] { return static_cast<int64_t>(balancer().invalidate(part.key.storage, part.key.offset, part.span)); });
}

int64_t invalidate_model_kernel(int64_t model) {
  return translate([&] { return static_cast<int64_t>(balancer().invalidate_model(model)); });
}

static_assert(std::is_same_v<decltype(invalidate_kernel), decltype(invalidate)>);
static_assert(std::is_same_v<decltype(invalidate_model_kernel), decltype(invalidate_model)>);

}  // namespace

int64_t invalidate(const at::Tensor& source) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::invalidate", "").typed<decltype(invalidate)>();
  return op.call(source);
}

int64_t invalidate_model(int64_t model) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::invalidate_model", "").typed<decltype(invalidate_model)>();
  return op.call(model);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("invalidate(Tensor source) -> int", &pins::ops::invalidate_kernel);
  m.def("invalidate_model(int model) -> int", &pins::ops::invalidate_model_kernel);
}
