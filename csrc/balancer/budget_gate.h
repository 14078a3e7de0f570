// The budget gate: what the balancer knows of system memory between readings,
// the bytes of pins being made, and how much idle pool memory stays committed.
// It decides nothing about which pins go (the balancer walks the eviction
// order for that); it says whether a new pin fits, reserves its bytes when it
// does, and keeps the pool's idle memory within the budget.
//
// Note [Memory readings]
// A reading of system memory (SystemMemoryProbe: /proc/meminfo and every cgroup
// level, tens of microseconds) is reused for the probe's max_age_ns (5 ms for
// the system; 0, read every time, for the models of memory in tests and the
// simulator). In between, the pool's own accounting moves it: every byte the
// pool committed since the reading is taken off `available`, every byte
// decommitted is added back. Other processes' use shows at the next reading.
// Before anything is evicted for a new pin, the reading is taken again
// (Balancer::ensure_budget), so a reused reading only ever says "it fits";
// relieve() reads afresh too.
//
// Note [Budget reservation]
// The budget check works on a reading of system memory taken unlocked, and a
// new pin's memory shows only once the pool allocated its block (committed
// pages are populated; a reused idle extent leaves the pool's idle count).
// Two casts on the same reading could each see room for one pin and both
// allocate. So a pin being made reserves its bytes, under the gate's lock,
// when the budget admits it, until its block is allocated (or refused): the
// check subtracts from the available figure every reservation held, and the
// bytes of reservations settled (blocks allocated) since the cast's reading
// was taken, which that reading may not show. The check after freeing is made
// again against the reservations of that moment. So the pins admitted on one
// reading never take more than it said was available; a reading is at worst
// conservative.
//
// Note [Warm idle memory]
// An evicted pin's memory stays committed (idle extents of the pool) so that
// the next pin reuses it warm: committing and faulting in fresh pages runs at a
// fifth of a copy into warm ones (docs/PERFORMANCE.md, fill). Idle bytes count
// as available to a new pin (Balancer::ensure_budget), and the pool keeps as
// many idle bytes as the budget lets stay committed: while available RAM stays
// at or above `line`, all of them; below it, it gives back the difference,
// never below the pool's own retain_free. While the balancer frees for a new
// pin, the pool keeps everything and the line is the pin's own
// (pin_reserve_line): the pin that asked for room reuses it at once. Otherwise
// (after a pin was made, after free() and a relieve() that found no pressure)
// the line is the headroom: idle memory never takes available RAM below the
// RAM-pressure line, where it would be memory the page cache could hold. A
// relieve() under pressure gives idle memory back before it evicts any pin,
// and its line is headroom + relieve_slack: the slack goes to the system, not
// to the pool, or the next allocation elsewhere would take available RAM below
// the headroom again at once. A registration ceiling that is hit drops idle
// extents before it drops any pin's page-lock. A reading of no available RAM
// at all gives every idle byte back whatever the line: it cannot say how far
// past the RAM the process is (a new pin the idle extents could not hold was
// committed fresh), and with a line of 0 (headroom:0) nothing else would.
#pragma once

#include <cstddef>
#include <cstdint>

#include "csrc/base/thread_safety.h"
#include "csrc/config/config.h"
#include "csrc/pool/pool.h"
#include "csrc/system/sysmem.h"

namespace pins {

class BudgetGate {
 public:
  // `pool` and `probe` must outlive the gate.
  BudgetGate(HostPool& pool, MemoryProbe& probe) : pool_(pool), probe_(probe) {}
  BudgetGate(const BudgetGate&) = delete;
  BudgetGate& operator=(const BudgetGate&) = delete;

  // Note [Memory readings]: the probe's reading, reused for max_age_ns and
  // adjusted by the pool's commits since; `fresh` reads now.
  MemoryInfo memory(bool fresh = false) PINS_EXCLUDES(mu_);
  // What a new pin may use on `mi`: the available RAM and the pool's idle
  // bytes (Note [Warm idle memory]), saturating.
  uint64_t room(const MemoryInfo& mi) const;

  // Note [Budget reservation]: the bytes settled so far, read before the
  // reading a later reserve() is given.
  uint64_t settled() const PINS_EXCLUDES(mu_);
  // Reserves `bytes` when the budget admits them on `available` (less the
  // reservations that a reading taken at `settled_at_read` does not show);
  // returns the shortfall, 0 when reserved.
  uint64_t reserve(size_t bytes, uint64_t available, uint64_t settled_at_read, const Config& c) PINS_EXCLUDES(mu_);
  // Ends a reservation of `bytes`: the pool allocated its block (`allocated`),
  // which it now accounts for, or refused it.
  void settle(size_t bytes, bool allocated) PINS_EXCLUDES(mu_);
  uint64_t reserved_bytes() const PINS_EXCLUDES(mu_);

  // Note [Warm idle memory]: sets the pool's retain limit from the budget and
  // decommits the idle bytes past it.
  void keep_warm(const MemoryInfo& mi, uint64_t line);

  // Note [Fork safety] (csrc/runtime/runtime.h): held across fork() by the
  // runtime's handlers, after the balancer's lock. Nothing else may call these.
  void lock_for_fork() PINS_ACQUIRE(mu_) { mu_.lock(); }
  void unlock_after_fork() PINS_RELEASE(mu_) { mu_.unlock(); }
  // The lock itself, for the annotations of a holder's fork handlers.
  const Mutex& fork_lock() const PINS_RETURN_CAPABILITY(mu_) { return mu_; }

 private:
  HostPool& pool_;
  MemoryProbe& probe_;
  // A leaf lock (Note [Lock order]): nothing else is taken while it is held
  // (the probe is read and the pool asked with it released).
  mutable Mutex mu_;
  // Note [Memory readings]: the last reading, when, and the pool's committed bytes then.
  MemoryInfo reading_ PINS_GUARDED_BY(mu_);
  int64_t reading_ns_ PINS_GUARDED_BY(mu_) = 0;  // 0: none yet
  size_t reading_committed_ PINS_GUARDED_BY(mu_) = 0;
  // Note [Budget reservation].
  uint64_t reserved_ PINS_GUARDED_BY(mu_) = 0;  // level: bytes of pins being made
  uint64_t settled_ PINS_GUARDED_BY(mu_) = 0;   // SUM: bytes of reservations ended by an allocation
};

}  // namespace pins
