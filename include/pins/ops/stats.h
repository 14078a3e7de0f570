// pins::stats, pins::summary, pins::locked_bytes (ops/stats.cpp).
#pragma once

#include <ATen/core/Dict.h>

#include <cstdint>
#include <string>

#include <pins/export.h>

namespace pins::ops {

// Every counter of the balancer and the host pool, by name ("hits",
// "pinned_bytes", "bypassed.refused", "model.<id>.weights.pins", ...). Each
// model's counters appear twice: under "model.<id>." and under
// "model.<name>.", where a name registered more than once (or made only of
// digits) reads "<name>#<id>" for all but the lowest id.
PINS_API c10::Dict<std::string, int64_t> stats();

// A few lines for people: pins and bytes per subset, hits, misses and hit rate,
// casts bypassed by reason, plain copies, what was freed, and one line per model.
PINS_API std::string summary();

// The pool's page-locked bytes now: stats()["locked_bytes"] without building
// every counter (an application that checks its own page-lock cap before each
// registration of its own, as ComfyUI's ensure_pin_registerable does).
PINS_API int64_t locked_bytes();

}  // namespace pins::ops
