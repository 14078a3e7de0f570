// Note [Adopted blocks] (pool.h): memory another component mapped, taken as
// one allocated block, page-locked here, released through its owner.
#include <exception>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"
#include "csrc/base/nvtx.h"
#include "csrc/pool/pool_records.h"

namespace pins {

const char* HostPool::overlap(uintptr_t addr, size_t size) const {
  // Each map holds disjoint ranges by base: only the last one starting before
  // the range's end can reach into it.
  const auto hits = [&](const auto& by_base) {
    auto it = by_base.upper_bound(addr + size - 1);
    return it != by_base.begin() && std::prev(it)->first + std::prev(it)->second->size > addr;
  };
  if (hits(segments_)) return "a segment";
  if (hits(adopted_)) return "an adopted block";
  return nullptr;
}

void* HostPool::adopt(void* data, size_t size, bool lock, std::function<void()> release) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(data);
  PINS_CHECK_VALUE(data != nullptr, "HostPool::adopt: data must not be null");
  PINS_CHECK_VALUE(base % page_ == 0, "HostPool::adopt: data must be page-aligned (page ", page_, " bytes), got ",
                   data);
  PINS_CHECK_VALUE(size > 0 && size % page_ == 0 && size <= kMaxAllocation,
                   "HostPool::adopt: size must be a positive multiple of the page (", page_,
                   " bytes) up to 2^48, got ", size);
  PINS_CHECK_VALUE(base + size > base, "HostPool::adopt: data ", data, " + size ", size,
                   " runs past the end of the address space");
  PINS_CHECK_VALUE(release != nullptr, "HostPool::adopt: release must be a callable, got an empty function");
  const bool want_lock = lock && can_lock_;
  Extent* e = nullptr;
  {
    MutexLock g(mu_);
    const char* clash = overlap(base, size);
    PINS_CHECK_VALUE(clash == nullptr, "HostPool::adopt: [", data, ", ", data, " + ", size, ") overlaps ", clash,
                     " of this pool");
    auto rec = std::make_unique<Extent>(Extent{base, size, nullptr, false});
    rec->adopted = true;
    rec->used = 1;
    rec->locking = want_lock;  // in no list, with no block, until its lock returns
    rec->release = std::move(release);
    e = rec.get();
    adopted_.emplace(base, std::move(rec));
    stats_.adopted_bytes.increase(static_cast<int64_t>(size));
    stats_.adopted_blocks.increase(1);
    if (!want_lock) {
      list_adopted(e);
      return data;
    }
  }
  int lrc = 0;
  int64_t ns = 0;
  {
    PINS_RANGE("pins::register");
    const int64_t t0 = monotonic_ns();
    lrc = backend_->lock(data, size);
    ns = monotonic_ns() - t0;
  }
  if (lrc != 0) warn_refused_lock(size, lrc);
  MutexLock g(mu_);
  e->locking = false;
  if (lrc != 0) {
    stats_.lock_failures++;  // served unlocked, as the backend left it
  } else {
    e->locked = true;
    stats_.registrations++;
    stats_.lock_ns += ns;
    stats_.locked_bytes.increase(static_cast<int64_t>(size));
  }
  list_adopted(e);
  return data;
}

void HostPool::list_adopted(Extent* e) {
  auto b = std::make_unique<Block>();
  b->addr = e->base;
  b->size = e->size;
  b->requested = e->size;
  b->ext = e;
  b->state = BlockState::Allocated;
  blocks_.emplace(b->addr, std::move(b));
}

void HostPool::retire(Block* b, std::vector<Extent*>& retired) {
  Extent* e = b->ext;
  PINS_ASSERT(e->adopted && !e->unlocking && !e->retiring && b->copies == 0);
  e->retiring = true;
  blocks_.erase(b->addr);  // its fences go with it: every one is done, and a reap still holds them
  retired.push_back(e);
}

void HostPool::release_adopted(std::vector<Extent*> retired) {
  // The extents are in adopted_ only, marked retiring, with no block: nobody
  // else touches them while unlocked.
  struct Done {
    Extent* e;
    bool locked;
    int rc;
    int64_t ns;
  };
  std::vector<Done> done;
  for (Extent* e : retired) {
    Done d{e, e->locked, 0, 0};
    if (d.locked) {
      PINS_RANGE("pins::unregister");
      const int64_t t0 = monotonic_ns();
      d.rc = backend_->unlock(reinterpret_cast<void*>(e->base), e->size);
      d.ns = monotonic_ns() - t0;
    }
    done.push_back(d);
  }
  std::vector<std::function<void()>> releases;
  {
    MutexLock g(mu_);
    for (const Done& d : done) {
      Extent* e = d.e;
      if (d.locked) {
        // A refused unlock is counted and the block forgotten all the same: the
        // pool cannot keep memory its owner is about to unmap.
        if (d.rc == 0) {
          stats_.unregistrations++;
          stats_.unlock_ns += d.ns;
        } else {
          stats_.lock_failures++;
        }
        stats_.locked_bytes.decrease(static_cast<int64_t>(e->size));
      }
      stats_.adopted_bytes.decrease(static_cast<int64_t>(e->size));
      stats_.adopted_blocks.decrease(1);
      releases.push_back(std::move(e->release));
      adopted_.erase(e->base);  // destroys e
    }
  }
  // Each runs even when one before it throws; the first exception is rethrown.
  std::exception_ptr first;
  for (auto& r : releases) {
    try {
      r();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace pins
