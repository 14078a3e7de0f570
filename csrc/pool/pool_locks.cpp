// Page-locks the pool takes and drops outside a commit: a cut of prewarmed
// memory locked for a request (Note [Host pool layout]), and unlock() of an
// extent or an adopted block (Note [Copies from a block]).
#include <algorithm>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"
#include "csrc/base/nvtx.h"
#include "csrc/pool/pool_records.h"

namespace pins {

bool HostPool::lock_prewarmed(Extent* pre, size_t need) {
  Extent* e = take_prewarmed(pre, std::min(pre->size, extent_size(need)));
  e->locking = true;
  mu_.unlock();
  int64_t t0 = 0, t1 = 0;
  int lrc = 0;
  {
    PINS_RANGE("pins::register");
    t0 = monotonic_ns();
    lrc = backend_->lock(reinterpret_cast<void*>(e->base), e->size);
    t1 = monotonic_ns();
  }
  if (lrc != 0) warn_refused_lock(e->size, lrc);
  mu_.lock();
  e->locking = false;
  if (lrc != 0) {
    stats_.lock_failures++;
    list_idle(e);  // committed, unlocked and idle: served unlocked, reused or decommitted like any other
    return false;
  }
  e->locked = true;
  stats_.registrations++;
  stats_.lock_ns += t1 - t0;
  stats_.locked_bytes.increase(static_cast<int64_t>(e->size));
  list_idle(e);
  return true;
}

void HostPool::move_free_blocks(Extent* e, bool from_locked, bool to_locked) {
  for (Block* b = blocks_.at(e->base).get(); b != nullptr; b = b->next) {
    if (b->state != BlockState::Free) continue;
    free_[from_locked].erase({b->size, b->addr});
    free_[to_locked].insert({b->size, b->addr});
  }
}

size_t HostPool::unlock(void* ptr) {
  Extent* e = nullptr;
  std::vector<std::shared_ptr<Fence>> fences;
  {
    MutexLock g(mu_);
    e = find(ptr, "HostPool::unlock")->ext;
    if (!e->locked || e->unlocking) return 0;
    // Note [Copies from a block]: any block of the extent, not only ptr's.
    for (Block* b = blocks_.at(e->base).get(); b != nullptr; b = b->next) {
      if (b->copies > 0) {
        stats_.busy_unlocks++;
        return 0;
      }
      fences.insert(fences.end(), b->fences.begin(), b->fences.end());
    }
    // From here new locked requests no longer use this extent.
    e->locked = false;
    e->unlocking = true;
    move_free_blocks(e, true, false);
  }
  const bool busy = std::any_of(fences.begin(), fences.end(), [](const auto& f) { return !f->done(); });
  int rc = 0;
  int64_t ns = 0;
  if (!busy) {
    PINS_RANGE("pins::unregister");
    const int64_t t0 = monotonic_ns();
    rc = backend_->unlock(reinterpret_cast<void*>(e->base), e->size);
    ns = monotonic_ns() - t0;
  }
  MutexLock g(mu_);
  e->unlocking = false;
  if (busy || rc != 0) {
    if (rc != 0) stats_.lock_failures++;
    if (busy) stats_.busy_unlocks++;
    e->locked = true;
    move_free_blocks(e, false, true);
    return 0;
  }
  stats_.unregistrations++;
  stats_.unlock_ns += ns;
  stats_.locked_bytes.decrease(static_cast<int64_t>(e->size));
  return e->size;
}

}  // namespace pins
