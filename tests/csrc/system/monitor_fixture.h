// What the pressure monitor's tests share: a probe the test sets, a wait for a
// condition, and a root where the monitor finds no PSI file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "csrc/base/check.h"
#include "csrc/base/size.h"
#include "csrc/system/sysmem.h"
#include "tests/csrc/system/fixture_root.h"

namespace pins::testing {

using Clock = std::chrono::steady_clock;

// A probe whose available RAM the test sets.
class FakeProbe : public MemoryProbe {
 public:
  explicit FakeProbe(uint64_t available) : available(available) {}
  MemoryInfo read() override {
    reads.fetch_add(1);
    if (fail.load()) throw ResourceError("fake probe failure");
    MemoryInfo m;
    m.total = 64 * GiB;
    m.available = available.load();
    return m;
  }
  std::atomic<uint64_t> available;
  std::atomic<bool> fail{false};
  std::atomic<uint64_t> reads{0};
};

// Waits up to 5 s for `cond`.
template <typename Cond>
bool eventually(Cond cond) {
  using namespace std::chrono_literals;
  const auto deadline = Clock::now() + 5s;
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// A root with no proc/pressure: on Linux the monitor polls. (Windows reads no
// root: its monitor waits on the system's notification all the same.)
inline std::string polling_root() {
  static FixtureRoot root;
  return root.path();
}

}  // namespace pins::testing
