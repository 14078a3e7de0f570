// pins::free_pins: frees pinned bytes along the eviction tiers on request (and,
// short of pins, the pool's idle committed memory: Balancer::free).
#include <pins/ops/free_pins.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <type_traits>

#include "ops/common.h"

namespace pins::ops {
namespace {

int64_t free_pins_kernel(int64_t bytes, bool evict_active, bool loaded) {
  TORCH_CHECK_VALUE(bytes >= 0, "free_pins: bytes must be non-negative, got ", bytes);
  return translate([&] {
    Balancer& b = balancer();
    // An explicit request for RAM: every pin's source is checked first (O(pins),
    // unlike an eviction decision's bounded step, Note [Dead source reclaim]).
    const size_t want = static_cast<size_t>(bytes), dead = b.sweep();
    return static_cast<int64_t>(dead + b.free(want > dead ? want - dead : 0, evict_active, loaded));
  });
}

static_assert(std::is_same_v<decltype(free_pins_kernel), decltype(free_pins)>);

}  // namespace

int64_t free_pins(int64_t bytes, bool evict_active, bool loaded) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::free_pins", "").typed<decltype(free_pins)>();
  return op.call(bytes, evict_active, loaded);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("free_pins(int bytes, bool evict_active=False, bool loaded=False) -> int", &pins::ops::free_pins_kernel);
}
