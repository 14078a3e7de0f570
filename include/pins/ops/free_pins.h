// pins::free_pins (ops/free_pins.cpp).
#pragma once

#include <cstdint>

#include <pins/export.h>

namespace pins::ops {

// Frees at least `bytes` of pins along the eviction tiers (the streaming pins of
// active models only with `evict_active`; with `loaded`, only what a new cache
// pin may take: no streaming pin of a model in the prompt) and returns the
// bytes freed. A negative `bytes` is a c10::ValueError.
PINS_API int64_t free_pins(int64_t bytes, bool evict_active = false, bool loaded = false);

}  // namespace pins::ops
