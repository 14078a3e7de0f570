// Timing for the pins-bench benchmarks: a steady-clock stopwatch, the median of
// repetitions, and a barrier that keeps the compiler from dropping a copy
// whose destination is never read.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace pins::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds `f` takes.
template <typename F>
double time_seconds(F&& f) {
  const double t0 = now_seconds();
  f();
  return now_seconds() - t0;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The memory behind `p` was written and may be read: the compiler keeps the writes.
inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

// The per-repetition line every benchmark prints above its RESULT: `label`
// then each value with `unit`.
inline void print_reps(const char* label, const std::vector<double>& values, double scale, const char* unit) {
  std::printf("  %-34s", label);
  for (double v : values) std::printf(" %9.3f", v * scale);
  std::printf("  %s (median %.3f)\n", unit, median(values) * scale);
}

}  // namespace pins::bench
