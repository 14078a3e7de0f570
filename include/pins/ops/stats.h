// pins::stats (ops/stats/stats.cpp).
#pragma once

#include <ATen/core/Dict.h>

#include <cstdint>
#include <string>

namespace pins::ops {

// Every counter of the balancer and the host pool, by name ("hits",
// "pinned_bytes", "model.<id>.weights.pins", ...).
c10::Dict<std::string, int64_t> stats();

}  // namespace pins::ops
