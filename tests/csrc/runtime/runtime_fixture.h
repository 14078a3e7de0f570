// What the runtime's tests share: a runtime on a system root with plenty of
// available RAM, and a wait for a condition.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "csrc/runtime/runtime.h"
#include "tests/csrc/system/fixture_root.h"

namespace pins::testing {

// Waits up to 5 s for `cond`.
template <typename Cond>
bool eventually(Cond cond) {
  using namespace std::chrono_literals;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// A system root with plenty of available RAM, so a monitor never relieves
// (Windows reads its own memory: Config::system_root has no meaning there).
class RuntimeTest : public ::testing::Test {
 protected:
  RuntimeTest() {
    root_.write("proc/meminfo",
                "MemTotal:       67108864 kB\n"
                "MemAvailable:   62914560 kB\n"
                "SwapTotal:      0 kB\n"
                "SwapFree:       0 kB\n");
  }
  // The monitor is off unless `extra` turns it on: a test that wants it says so
  // (and a fork child then has a monitor to replace, Note [Fork safety]).
  Config config(const std::string& extra = "") const {
    return parse_config("backend:null,segment_size:64MiB,extent_min:1MiB,cap:8MiB,monitor:false,system_root:" +
                        root_.path() + (extra.empty() ? "" : "," + extra));
  }
  FixtureRoot root_;
};

}  // namespace pins::testing
