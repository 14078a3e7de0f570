#include "csrc/balancer/budget.h"

#include <algorithm>
#include <limits>

namespace pins {
namespace {

uint64_t add_sat(uint64_t a, uint64_t b) { return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b; }
uint64_t sub_sat(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

uint64_t pin_shortfall(uint64_t bytes, uint64_t available, const Config& c) {
  const uint64_t reserve = std::max(c.headroom / 2, c.pin_reserve);
  return sub_sat(add_sat(bytes, reserve), available);
}

uint64_t pin_free_goal(uint64_t shortfall, const Config& c) {
  return shortfall == 0 ? 0 : add_sat(shortfall, c.pin_slack);
}

uint64_t relieve_shortfall(uint64_t available, const Config& c) { return sub_sat(c.headroom, available); }

uint64_t relieve_free_goal(uint64_t shortfall, const Config& c) {
  return shortfall == 0 ? 0 : add_sat(shortfall, c.relieve_slack);
}

bool lock_fits(uint64_t locked, uint64_t bytes, uint64_t ceiling) { return add_sat(locked, bytes) <= ceiling; }

uint64_t lock_drop_goal(uint64_t ceiling, uint64_t bytes, const Config& c) {
  return sub_sat(ceiling, add_sat(c.lock_hysteresis, bytes));
}

}  // namespace pins
