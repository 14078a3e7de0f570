// pins::free_pins: frees pinned bytes along the eviction tiers on request.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "ops/common.h"
#include <pins/ops.h>

namespace pins::ops {
namespace {

int64_t free_pins_kernel(int64_t bytes, bool evict_active) {
  TORCH_CHECK(bytes >= 0, "free_pins: bytes must be non-negative, got ", bytes);
  return translate([&] { return static_cast<int64_t>(balancer().free(static_cast<size_t>(bytes), evict_active)); });
}

}  // namespace

int64_t free_pins(int64_t bytes, bool evict_active) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::free_pins", "").typed<int64_t(int64_t, bool)>();
  return op.call(bytes, evict_active);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("free_pins(int bytes, bool evict_active=False) -> int", &pins::ops::free_pins_kernel);
}
