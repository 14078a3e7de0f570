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

// Note [Pressure from others]
// Inside a node, a new pin may take available RAM below the headroom, down to
// the pin reserve line (max(headroom/2, pin_reserve)); the RAM-pressure check
// at the next node boundary brings it back above the headroom. The pressure
// monitor (csrc/system/monitor.h) checks between boundaries too, for another
// process's allocations. Were its line the headroom, it would also take pins'
// own growth into that slack for pressure and free the pins at once, 20 ms
// later: in a sampler loop larger than the pins, the next step reads them from
// disk again, pins them again, and the monitor frees them again. The simulator
// with such a monitor (pins-sim --monitor-at-headroom; it checks after every
// cast) read 7% more on the 12 GB-VRAM WAN rerun with trace (277 -> 297 GiB
// over runs 2-6) and 25% more on the SDXL rerun (21.5 -> 26.9; mru 21.5 ->
// 36.0) than with a monitor that never fires on pins' own growth; the demo
// ran with the monitor off and never showed it.
// So the monitor's line is what the last relieve() left (the headroom, or the
// available RAM it left when it could not free enough: the active model's
// pins, which no check may take) less pins' own growth since (the pool's
// committed bytes above what they were then), by at most the slack: headroom
// - the pin reserve line, and one extent of the pool, which a new pin commits
// whole past what its admission saw. Available RAM that pins alone took down
// stays above the line, and an allocation of another process takes it below:
// the monitor then relieves as before, down to headroom + relieve_slack, the
// slack's pins included.
// A node or prompt boundary's relieve() asks the same: what pins alone took
// below the headroom stays theirs (relieve() frees nothing while available RAM
// is at or above the line), and any other process's use on top of it brings
// available RAM back to headroom + relieve_slack. Until 2026-12 a boundary
// checked against the headroom itself and freed pins' own slack, and
// relieve_slack with it, at every node: on a machine whose RAM holds the
// workflow, the next node read those bytes from disk again (neither pinned nor
// in the page cache, as pins are filled past it). On suite seeds 1-5 the trace
// policy reads 0.7-1.5% less in total, and 38 -> 24 scenarios read more than
// the lesser of lru and mru plus a layer; what pins then hold at rest, and its
// risk, is in docs/RELIABILITY.md "Memory pressure from another process".
// A shared pin (Note [Shared pins]) is an adopted mapping, not committed pool
// memory: one this process fills inside a node counts as another's use, and
// the monitor relieves for it as it did before, on the safe side.
//
// The line: min(headroom, left) - min(own_growth, headroom - reserve_line),
// saturating at 0; `left` is the available RAM the last relieve() left.
uint64_t pressure_line(uint64_t own_growth, uint64_t left, uint64_t headroom, uint64_t reserve_line);

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
