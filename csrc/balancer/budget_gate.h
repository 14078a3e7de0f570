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
// conservative. A reservation holds whole pages (what the pool commits), and
// it counts against both budgets, RAM's and the cap's (Note [Cap budget]).
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
// (after a pin was made or refused, after free() and a relieve() that found no
// pressure) the line is the headroom: idle memory never takes available RAM
// below the RAM-pressure line, where it would be memory the page cache could
// hold. A refused pin is copied from its source through that page cache: on
// pins-sim's u24-33 (HiDream on 32 GiB), 161 MiB the walk had freed for a
// refused layer stayed idle, and two streamed layers that the page cache then
// could not hold were read from disk at every step. A
// relieve() under pressure gives idle memory back before it evicts any pin,
// and its line is headroom + relieve_slack: the slack goes to the system, not
// to the pool, or the next allocation elsewhere would take available RAM below
// the headroom again at once. A registration ceiling that is hit drops idle
// extents before it drops any pin's page-lock. A reading of no available RAM
// at all gives every idle byte back whatever the line: it cannot say how far
// past the RAM the process is (a new pin the idle extents could not hold was
// committed fresh), and with a line of 0 (headroom:0) nothing else would.
//
// Note [Cap budget]
// The pool's `cap` (PINS_CONF) bounds its committed bytes. The pool alone
// refuses a block past it, first come first served: the pins made first stay
// and a later one is copied from its source at every cast, whatever the policy
// would keep. So the cap is a budget of the balancer too, beside RAM's. A new
// pin's room under it is what the pool could commit for it: cap + idle -
// committed (make_room() decommits idle extents, oldest first, and a request
// reuses one it fits). A pin that a free block of an extent in use holds whole
// commits nothing: that block is room for its pages, counted as room (not as
// no cap at all) so that two pins made at once do not both take it, the second
// then refused by the pool. A pin of a shared segment needs no room (Note
// [Shared pins]: the pool adopts it, outside the cap); nor does one larger
// than the cap, which no freeing makes fit (the pool refuses it:
// bypassed.pool). What the cap lacks,
// the pin's whole pages less that room and less what pins being made reserved
// (Note [Budget reservation]), is freed along the same tiers and policy order
// as RAM's shortfall, in the same walk (so Note [Trace bypass] refuses a pin
// under the cap as under RAM: bypassed.refused), with no pin_slack: the cap's
// figures are exact, and pins freed ahead of need are pins the policy kept.
// An evicted pin's extent goes idle once no other block of it is allocated. A
// pin of more than half extent_min has an extent of its own; a smaller one
// shares an extent_min extent with other small pins (Note [Host pool layout]
// in csrc/pool/pool.h), and its freed block serves a new pin that fits in it
// but gives the cap no room while the extent holds other pins. So the room is
// read again after freeing, and while the cap still lacks, the next pin in the
// order goes, one at a time, until an extent goes idle or none is left to go
// (the pin is then refused, and those freed stay freed). Prewarmed memory is
// idle memory: it never takes a pin's room under the cap, and the pool never
// prewarms past the cap. The cap's figures are exact for pins made at once
// too: the pool counts the pages of each block a reservation asked for
// (HostPool::CapRoom::budgeted) under the lock its committed bytes move under,
// and the room is read with that count, so the pins it does not show are the
// pages admitted for pool blocks and not refused, less that count: pins being
// made, and blocks allocated since. (Counted against settle(), which comes
// after the allocation, a block allocated and not yet settled was counted
// twice, and a cast on another thread then evicted one pin too many.)
// Allocations the pool makes for the torch host allocator (allocator/)
// reserve nothing: one made between a pin's admission and its block, or a
// small pin that another took the free block of (its extent shrinks the room
// by more than its pages), can still meet the pool's refusal (bypassed.pool).
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
  BudgetGate(HostPool& pool, MemoryProbe& probe) : pool_(pool), probe_(probe), page_(pool.backend().page_size()) {}
  BudgetGate(const BudgetGate&) = delete;
  BudgetGate& operator=(const BudgetGate&) = delete;

  // Note [Memory readings]: the probe's reading, reused for max_age_ns and
  // adjusted by the pool's commits since; `fresh` reads now.
  MemoryInfo memory(bool fresh = false) PINS_EXCLUDES(mu_);
  // What a new pin may use on `mi`: the available RAM and the pool's idle
  // bytes (Note [Warm idle memory]), saturating.
  uint64_t room(const MemoryInfo& mi) const;

  // Note [Cap budget]: the bytes a new pin of `bytes` may commit under the
  // pool's cap (its idle extents decommitted), with the pin's own pages when
  // a free block of an extent in use holds it whole; kNoCap where the cap
  // binds it to nothing: no cap, or it is larger than the cap (the pool
  // refuses it whatever is freed). Takes the pool's lock once.
  static constexpr uint64_t kNoCap = UINT64_MAX;
  struct CapFigure {
    uint64_t room = kNoCap;
    uint64_t budgeted = 0;  // HostPool::CapRoom::budgeted, read with `room`
  };
  CapFigure cap_room(size_t bytes) const;

  // Note [Budget reservation]: the bytes settled so far, read before the
  // reading a later reserve() is given.
  uint64_t settled() const PINS_EXCLUDES(mu_);
  // What a new pin may use: RAM's figure with the settled() read before it,
  // the cap's with the budgeted blocks it shows.
  struct Room {
    uint64_t available = 0;      // room() on a reading of system memory
    uint64_t available_settled = 0;
    CapFigure cap;               // cap_room()
  };
  // What each budget lacks; none() when the pin was admitted.
  struct Shortfall {
    uint64_t ram = 0;
    uint64_t cap = 0;
    bool none() const { return ram == 0 && cap == 0; }
  };
  // Reserves `bytes` (whole pages: what the pool commits) when both budgets
  // admit them on `room`, less the reservations each figure does not show
  // (RAM's: those held, and those settled since its settled() was read; the
  // cap's: those admitted for a pool block, `in_pool`, and not refused, less
  // the budgeted blocks it shows); returns the shortfalls, none() when reserved.
  Shortfall reserve(size_t bytes, const Room& room, bool in_pool, const Config& c) PINS_EXCLUDES(mu_);
  // Ends a reservation of `bytes`: the pool allocated its block (`allocated`),
  // which it now accounts for, or refused it; `in_pool` as reserve()'s.
  void settle(size_t bytes, bool allocated, bool in_pool) PINS_EXCLUDES(mu_);
  uint64_t reserved_bytes() const PINS_EXCLUDES(mu_);  // whole pages

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
  const uint64_t page_;
  uint64_t pages(size_t bytes) const { return (static_cast<uint64_t>(bytes) + page_ - 1) / page_ * page_; }
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
  // Note [Cap budget]: SUMs of the reservations for pool blocks admitted, and
  // of those the pool refused; less the pool's budgeted blocks, the pages the
  // cap's figure does not show.
  uint64_t pool_admitted_ PINS_GUARDED_BY(mu_) = 0;
  uint64_t pool_refused_ PINS_GUARDED_BY(mu_) = 0;
};

}  // namespace pins
