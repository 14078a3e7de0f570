// The budget formulas of DESIGN.md "Budget" as pure functions of the
// configuration and the memory numbers, so they can be checked by hand. R, A
// and swap come from a MemoryInfo; the pin ceiling itself is pin_ceiling() in
// csrc/system/sysmem.h. Each result is exact whenever it lies in [0, 2^64 - 1]
// and saturates otherwise, never wraps (Note [Exact budget arithmetic] in
// budget.cpp).
#pragma once

#include <cstdint>

#include "csrc/config/config.h"

namespace pins {

// Before pinning `bytes`: shortfall = bytes + max(headroom/2, pin_reserve) - A,
// 0 when the pin fits in available RAM `available`.
uint64_t pin_shortfall(uint64_t bytes, uint64_t available, const Config& c);
// The available RAM a new pin must leave: max(headroom/2, pin_reserve).
uint64_t pin_reserve_line(const Config& c);
// What freeing aims at for a pin's shortfall: shortfall + pin_slack; 0 for none.
// The pin is created only when at least the shortfall itself was freed.
uint64_t pin_free_goal(uint64_t shortfall, const Config& c);

// The RAM-pressure check: shortfall = headroom - A, 0 when A covers the headroom.
uint64_t relieve_shortfall(uint64_t available, const Config& c);
// What relieve() frees for it: shortfall + relieve_slack; 0 for none.
uint64_t relieve_free_goal(uint64_t shortfall, const Config& c);

// Note [Prewarm]: the bytes a prewarm may commit on available RAM `available`
// with `reserved` bytes of pins being made: available - reserved -
// max(headroom, pin_reserve_line), 0 when that is negative.
uint64_t prewarm_room(uint64_t available, uint64_t reserved, const Config& c);

// The registration ceiling: whether `bytes` more page-locked bytes fit under
// `ceiling` with `locked` bytes page-locked now.
bool lock_fits(uint64_t locked, uint64_t bytes, uint64_t ceiling);
// When they do not: page-locks drop until at most this many bytes stay locked,
// so a new pin of `bytes` fits with lock_hysteresis to spare: ceiling -
// lock_hysteresis - bytes, 0 when that is negative.
uint64_t lock_drop_goal(uint64_t ceiling, uint64_t bytes, const Config& c);

}  // namespace pins
