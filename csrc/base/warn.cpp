#include "csrc/base/warn.h"

#include <cstdio>

namespace pins {

bool warn_once(std::atomic<bool>& once, const std::string& text) {
  if (once.exchange(true, std::memory_order_relaxed)) return false;
  const std::string line = "pins: warning: " + text + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of threads do not interleave
  std::fflush(stderr);
  return true;
}

}  // namespace pins
