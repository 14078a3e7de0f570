// The monotonic clock in nanoseconds: what pins times and ages things by (a
// memory reading's age, a file's last look, time spent page-locking).
#pragma once

#include <chrono>
#include <cstdint>

namespace pins {

inline int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace pins
