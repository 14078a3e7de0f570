// Saturating unsigned arithmetic: a result past 2^64 - 1 is 2^64 - 1, a
// negative one is 0. For byte counts and clocks that must never wrap.
#pragma once

#include <cstdint>
#include <limits>

namespace pins {

inline constexpr uint64_t add_sat(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}
inline constexpr uint64_t sub_sat(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }
inline constexpr uint64_t mul_sat(uint64_t a, uint64_t b) {
  return b != 0 && a > std::numeric_limits<uint64_t>::max() / b ? std::numeric_limits<uint64_t>::max() : a * b;
}

}  // namespace pins
