// The pin ceiling, the same on every system (the readings it starts from are
// sysmem_linux.cpp's or sysmem_win.cpp's).
#include "csrc/system/sysmem.h"

#include <algorithm>

#include "csrc/base/saturate.h"

namespace pins {

uint64_t pin_ceiling(const MemoryInfo& m, const Config& c) {
  const uint64_t r = m.total;
  // fraction*R, floored, within [0, R] whatever the fraction.
  const auto share = [r](double fraction) -> uint64_t {
    const double x = fraction * static_cast<double>(r);
    if (!(x > 0)) return 0;
    if (x >= static_cast<double>(r)) return r;
    return std::min(r, static_cast<uint64_t>(x));
  };
  const uint64_t upper = std::min({share(c.ceiling_max), sub_sat(r, c.ceiling_reserve),
                                   sub_sat(add_sat(r, m.swap_total), c.ceiling_swap_reserve)});
  return std::max(share(c.ceiling_min), upper);
}

}  // namespace pins
