#include "csrc/balancer/budget_gate.h"

#include <algorithm>

#include "csrc/balancer/budget.h"
#include "csrc/base/clock.h"
#include "csrc/base/saturate.h"

namespace pins {

MemoryInfo BudgetGate::memory(bool fresh) {
  const int64_t max_age = probe_.max_age_ns();
  if (max_age <= 0) return probe_.read();
  const int64_t now = monotonic_ns();
  const size_t committed = pool_.committed_bytes();
  if (!fresh) {
    MutexLock g(mu_);
    if (reading_ns_ != 0 && now - reading_ns_ < max_age) {
      MemoryInfo mi = reading_;
      if (committed >= reading_committed_) {
        mi.available = sub_sat(mi.available, committed - reading_committed_);
      } else {
        mi.available = std::min<uint64_t>(mi.available + (reading_committed_ - committed), mi.total);
      }
      return mi;
    }
  }
  const MemoryInfo mi = probe_.read();  // outside mu_: a /proc read
  MutexLock g(mu_);
  if (now >= reading_ns_) {
    reading_ = mi;
    reading_ns_ = now;
    reading_committed_ = committed;
  }
  return mi;
}

uint64_t BudgetGate::room(const MemoryInfo& mi) const { return add_sat(mi.available, pool_.idle_bytes()); }

uint64_t BudgetGate::settled() const {
  MutexLock g(mu_);
  return settled_;
}

BudgetGate::CapFigure BudgetGate::cap_room(size_t bytes) const {
  const HostPool::CapRoom r = pool_.cap_room(bytes, pool_.backend().can_lock());
  if (r.cap == 0 || pages(bytes) > r.cap) return {kNoCap, r.budgeted};
  // A free block of an extent in use is room for this one pin, which two pins
  // being made at once cannot both count: it is room, not kNoCap, so that the
  // reservation of the first to take it (Note [Budget reservation]) holds the
  // second off.
  return {add_sat(r.room, r.free_block ? pages(bytes) : 0), r.budgeted};
}

BudgetGate::Shortfall BudgetGate::reserve(size_t bytes, const Room& room, bool in_pool, const Config& c) {
  const uint64_t need = pages(bytes);
  Shortfall out;
  MutexLock g(mu_);
  // settled_ only grows; a sum past 2^64 cannot be available anyway.
  const uint64_t unseen = add_sat(reserved_, settled_ - room.available_settled);
  out.ram = pin_shortfall(bytes, sub_sat(room.available, unseen), c);
  // Note [Cap budget]: the pool counts a budgeted block under the lock its
  // committed bytes move under, so the pages admitted for pool blocks and not
  // refused, less the budgeted blocks the figure shows, are exactly those it
  // does not show: pins being made, and blocks allocated since it was read.
  if (room.cap.room != kNoCap) {
    const uint64_t unseen_cap = sub_sat(pool_admitted_ - pool_refused_, room.cap.budgeted);
    out.cap = sub_sat(add_sat(need, unseen_cap), room.cap.room);
  }
  if (out.none()) {
    reserved_ += need;
    if (in_pool) pool_admitted_ += need;
  }
  return out;
}

void BudgetGate::settle(size_t bytes, bool allocated, bool in_pool) {
  const uint64_t need = pages(bytes);
  MutexLock g(mu_);
  reserved_ -= need;
  if (allocated) settled_ += need;
  if (in_pool && !allocated) pool_refused_ += need;
}

uint64_t BudgetGate::reserved_bytes() const {
  MutexLock g(mu_);
  return reserved_;
}

void BudgetGate::keep_warm(const MemoryInfo& mi, uint64_t line) {
  const uint64_t idle = pool_.idle_bytes();
  const uint64_t room = idle + mi.available;  // available once the idle bytes went back
  const uint64_t warm = mi.available == 0 ? 0 : sub_sat(room, line);
  const uint64_t keep = std::max<uint64_t>(pool_.options().retain_free, warm);
  pool_.set_retain_free(static_cast<size_t>(keep));
  if (idle > keep) pool_.trim(static_cast<size_t>(keep));
}

}  // namespace pins
