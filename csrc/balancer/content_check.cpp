#include "csrc/balancer/content_check.h"

#include <algorithm>

#include "csrc/base/check.h"

namespace pins {
namespace {

// splitmix64: two well-mixed draws from one seed.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<Window> content_windows(uint64_t nbytes, uint64_t seed) {
  constexpr uint64_t L = kContentWindowBytes;
  std::vector<Window> out;
  if (nbytes <= kContentWindows * L) {  // small: compared whole
    for (uint64_t at = 0; at < nbytes; at += L) out.push_back({at, std::min(L, nbytes - at)});
    return out;
  }
  // Slots k * L for k in [1, last]: each window [k L, k L + L) ends before
  // the last window [nbytes - L, nbytes) begins. nbytes > 4 L, so last >= 2.
  const uint64_t last = (nbytes - L) / L - 1;
  const uint64_t mid = (1 + last) / 2;  // one draw in [1, mid], one in [mid + 1, last]
  const uint64_t a = 1 + mix(seed) % mid;
  const uint64_t b = mid + 1 + mix(seed ^ 0xD1B54A32D192ED03ull) % (last - mid);
  out.push_back({0, L});
  out.push_back({a * L, L});
  out.push_back({b * L, L});
  out.push_back({nbytes - L, L});
  return out;
}

void ContentSample::add(const char* source, uint64_t offset, uint64_t bytes) {
  PINS_ASSERT(count_ < kContentWindows && bytes <= kContentWindowBytes, "window ", count_, " of ", bytes,
              " bytes");
  offset_[count_] = offset;
  bytes_of_[count_] = static_cast<uint32_t>(bytes);
  std::memcpy(bytes_ + count_ * kContentWindowBytes, source + offset, bytes);
  reach_ = std::max(reach_, offset + bytes);
  ++count_;
}

}  // namespace pins
