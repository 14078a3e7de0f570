#include "csrc/balancer/budget.h"

#include <algorithm>

#include "csrc/base/saturate.h"

namespace pins {
namespace {

// Note [Exact budget arithmetic]: every result is the exact value of its
// formula whenever that value lies in [0, 2^64 - 1]; a value past 2^64 - 1
// saturates to 2^64 - 1 and a negative one to 0. An intermediate sum never
// saturates on its own (that would turn "bytes + reserve - available" near 2^64
// into a wrong answer, not a saturated one): add_sub_sat below, over the
// saturating helpers of csrc/base/saturate.h.

// a + b - c, exactly, saturated at both ends.
uint64_t add_sub_sat(uint64_t a, uint64_t b, uint64_t c) {
  if (a >= c) return add_sat(a - c, b);
  return sub_sat(b, c - a);
}

}  // namespace

uint64_t pin_reserve_line(const Config& c) { return std::max(c.headroom / 2, c.pin_reserve); }

uint64_t pin_shortfall(uint64_t bytes, uint64_t available, const Config& c) {
  return add_sub_sat(bytes, pin_reserve_line(c), available);
}

uint64_t pin_free_goal(uint64_t shortfall, const Config& c) {
  return shortfall == 0 ? 0 : add_sat(shortfall, c.pin_slack);
}

uint64_t relieve_shortfall(uint64_t available, const Config& c) { return sub_sat(c.headroom, available); }

uint64_t relieve_free_goal(uint64_t shortfall, const Config& c) {
  return shortfall == 0 ? 0 : add_sat(shortfall, c.relieve_slack);
}

uint64_t pressure_line(uint64_t own_growth, uint64_t left, uint64_t headroom, uint64_t reserve_line) {
  return sub_sat(std::min(headroom, left), std::min(own_growth, sub_sat(headroom, reserve_line)));
}

uint64_t prewarm_room(uint64_t available, uint64_t reserved, const Config& c) {
  return sub_sat(sub_sat(available, reserved), std::max(c.headroom, pin_reserve_line(c)));
}

bool lock_fits(uint64_t locked, uint64_t bytes, uint64_t ceiling) { return bytes <= ceiling && locked <= ceiling - bytes; }

uint64_t lock_drop_goal(uint64_t ceiling, uint64_t bytes, const Config& c) {
  // ceiling - (hysteresis + bytes): a sum past 2^64 - 1 makes the exact value negative.
  if (bytes > ceiling) return 0;
  return sub_sat(ceiling - bytes, c.lock_hysteresis);
}

}  // namespace pins
