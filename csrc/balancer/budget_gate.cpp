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

uint64_t BudgetGate::reserve(size_t bytes, uint64_t available, uint64_t settled_at_read, const Config& c) {
  MutexLock g(mu_);
  // settled_ only grows; a sum past 2^64 cannot be available anyway.
  const uint64_t unseen = add_sat(reserved_, settled_ - settled_at_read);
  const uint64_t shortfall = pin_shortfall(bytes, sub_sat(available, unseen), c);
  if (shortfall == 0) reserved_ += bytes;
  return shortfall;
}

void BudgetGate::settle(size_t bytes, bool allocated) {
  MutexLock g(mu_);
  reserved_ -= bytes;
  if (allocated) settled_ += bytes;
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
