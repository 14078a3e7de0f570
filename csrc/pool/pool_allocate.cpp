// HostPool::try_allocate() step by step (Note [Host pool layout]), and the
// free address space it commits extents in: segments and their free ranges.
#include <algorithm>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"
#include "csrc/base/nvtx.h"
#include "csrc/base/warn.h"
#include "csrc/pool/pool_records.h"

namespace pins {

void* HostPool::try_allocate(size_t size, bool lock, bool budgeted) {
  PINS_CHECK_VALUE(size > 0, "pool allocation size must be positive, got ", size);
  // Past this bound round_align() and round_page() could wrap (SIZE_MAX - 511
  // would round to 0); below it no sum of the pool's sizes comes near 2^64.
  PINS_CHECK_VALUE(size <= kMaxAllocation, "pool allocation size must be at most 2^48 bytes, got ", size);
  bool want_lock = lock && can_lock_;
  const size_t asize = round_align(size);
  const size_t need = round_page(asize);
  reap();

  MutexLock g(mu_);
  uintptr_t fresh = 0;  // the extent step 5 committed for this request
  for (;;) {
    // 1. A free block of an extent committed (and locked) already.
    if (Block* b = take_free(asize, want_lock, fresh)) {
      if (budgeted) budgeted_ += need;  // under the lock that `committed` moves under
      return finish(b, size);
    }
    // 2. A locked request locks a cut of prewarmed memory; the cut is served
    // unlocked when the backend refuses the lock (Note [Refused page-locks]).
    if (want_lock) {
      if (Extent* pre = find_prewarmed(need)) {
        if (!lock_prewarmed(pre, need)) want_lock = false;
        continue;  // step 1 takes it
      }
    }
    // 3. Room under the cap for a new extent, decommitting idle ones.
    const Room room = make_room(need);
    if (room == Room::Refused) {
      stats_.refusals++;
      return nullptr;
    }
    if (room == Room::Freed) continue;
    // 4. Free address space for it, reserving a segment when none is left.
    size_t esize = new_extent_size(need);
    uintptr_t addr = 0;
    Segment* seg = nullptr;
    if (!take_space(need, esize, &addr, &seg)) {
      if (!reserve_segment(need)) {
        stats_.refusals++;
        return nullptr;
      }
      continue;
    }
    // 5. The extent committed (and locked), then step 1 takes it; unlocked
    // when the backend refuses the lock (Note [Refused page-locks]).
    const Committed c = commit_extent(addr, esize, seg, want_lock);
    if (c == Committed::Refused) {
      stats_.refusals++;
      return nullptr;
    }
    if (c == Committed::Unlocked) want_lock = false;
    fresh = addr;
  }
}

void* HostPool::allocate(size_t size, bool lock) {
  if (void* p = try_allocate(size, lock)) return p;
  const PoolStats s = stats();
  throw ResourceError(detail::cat("pins host pool refused an allocation of ", size, " bytes: cap ", cap(),
                                  " bytes, committed ", s.committed_bytes.current, " bytes, allocated ",
                                  s.allocated_bytes.current, " bytes (backend ", s.backend, ")"));
}

HostPool::FreeSet::const_iterator HostPool::find_free(size_t asize, bool locked, uintptr_t fresh) const {
  const FreeSet& set = free_[locked];
  auto it = set.lower_bound({asize, 0});
  // Note [Idle extents are not cut]: past an idle extent of another size
  // than this request's own, and past the free rest of an extent larger than
  // extent_min in use (a large request's own: its page-rounding tail), to the
  // next larger block; an extent in use of at most extent_min is shared by
  // whatever fits, and the one committed for this request (`fresh`: cut to
  // the cap's room or the address space left, it may be smaller than its own)
  // is its.
  const size_t own = extent_size(round_page(asize)), shared = shared_extent();
  while (it != set.end()) {
    const Extent* x = blocks_.at(it->second)->ext;
    if ((x->used > 0 && x->size <= shared) || x->prewarmed || x->size == own || x->base == fresh) break;
    ++it;
  }
  return it;
}

HostPool::Block* HostPool::take_free(size_t asize, bool locked, uintptr_t fresh) {
  auto& set = free_[locked];
  auto it = find_free(asize, locked, fresh);
  if (it == set.end()) return nullptr;
  Block* b = blocks_.at(it->second).get();
  if (b->ext->prewarmed) {
    // Note [Host pool layout]: cut to the extent this request would commit.
    Extent* e = take_prewarmed(b->ext, std::min(b->ext->size, extent_size(round_page(asize))));
    list_idle(e);
    it = set.find({e->size, e->base});
    b = blocks_.at(e->base).get();
  }
  set.erase(it);
  if (b->ext->used == 0) {
    idle_.erase({b->ext->idle_since, b->ext});
    idle_bytes_ -= b->ext->size;
  }
  if (b->size - asize >= align_) {
    auto rest = std::make_unique<Block>();
    rest->addr = b->addr + asize;
    rest->size = b->size - asize;
    rest->ext = b->ext;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest.get();
    b->next = rest.get();
    b->size = asize;
    set.insert({rest->size, rest->addr});
    blocks_.emplace(rest->addr, std::move(rest));
  }
  return b;
}

void* HostPool::finish(Block* b, size_t requested) {
  b->state = BlockState::Allocated;
  b->requested = requested;
  b->ext->used++;
  stats_.allocations++;
  stats_.allocated_bytes.increase(static_cast<int64_t>(b->size));
  stats_.requested_bytes.increase(static_cast<int64_t>(requested));
  stats_.blocks.increase(1);
  return reinterpret_cast<void*>(b->addr);
}

HostPool::Room HostPool::make_room(size_t need) {
  if (cap_ == 0 || stats_.committed_bytes.current + committing_ + need <= cap_) return Room::Fits;
  const size_t over = stats_.committed_bytes.current + committing_ + need - cap_;
  std::vector<Extent*> victims = pick_idle(over);
  if (victims.empty()) return Room::Refused;
  mu_.unlock();
  decommit(std::move(victims));
  mu_.lock();
  return Room::Freed;
}

HostPool::CapRoom HostPool::cap_room(size_t size, bool lock) const {
  CapRoom out;
  MutexLock g(mu_);
  out.cap = cap_;
  if (cap_ == 0) return out;
  // What make_room() can reach: every idle extent (an extent being unlocked
  // only for now), and the room the cap leaves; saturating, for a cap near 2^64.
  const size_t used = static_cast<size_t>(stats_.committed_bytes.current) + committing_;
  const size_t top = cap_ > SIZE_MAX - idle_bytes_ ? SIZE_MAX : cap_ + idle_bytes_;
  out.room = top > used ? top - used : 0;
  // Step 1 of try_allocate(): the free block it takes holds it. One of an idle
  // extent is in `room` already (taking it makes the extent used: the room
  // shrinks by the extent), so only one of an extent in use is told apart.
  const bool locked = lock && can_lock_;
  const auto it = find_free(round_align(std::min(size, kMaxAllocation)), locked);
  out.free_block = it != free_[locked].end() && blocks_.at(it->second)->ext->used > 0;
  out.budgeted = budgeted_;
  return out;
}

size_t HostPool::new_extent_size(size_t need) const {
  // Requests up to half an extent share extent_min extents (a tail that small
  // requests fill); larger ones get an exact extent, so the tail never strands.
  size_t esize = extent_size(need);
  // Whole pages of what the cap leaves (a cap such as 1MB = 10^6 is no
  // multiple of the page; make_room() left at least `need`, itself whole
  // pages): an extent is always page-aligned (Note [Host backend contract]).
  if (cap_ != 0) esize = std::min(esize, (cap_ - stats_.committed_bytes.current - committing_) & ~(page_ - 1));
  return esize;
}

bool HostPool::take_space(size_t need, size_t& esize, uintptr_t* addr, Segment** seg) {
  if (take_range(esize, addr, seg)) return true;
  if (esize > need && take_range(need, addr, seg)) {
    esize = need;
    return true;
  }
  return false;
}

bool HostPool::reserve_segment(size_t bytes) {
  const size_t ssize = std::max(round_page(opts_.segment_size), bytes);
  mu_.unlock();  // mmap runs unlocked
  void* p = nullptr;
  const int rc = backend_->reserve(ssize, &p);
  mu_.lock();
  if (rc != 0) return false;
  auto s = std::make_unique<Segment>(Segment{reinterpret_cast<uintptr_t>(p), ssize, 0});
  Segment* sp = s.get();
  segments_.emplace(sp->base, std::move(s));
  stats_.segments++;
  stats_.reserved_bytes.increase(static_cast<int64_t>(ssize));
  add_range(sp->base, ssize, sp);
  return true;
}

HostPool::Committed HostPool::commit_extent(uintptr_t addr, size_t esize, Segment* seg, bool lock) {
  committing_ += esize;
  mu_.unlock();
  void* p = reinterpret_cast<void*>(addr);
  const int64_t t0 = monotonic_ns();
  const int rc = backend_->commit(p, esize);
  const int64_t t1 = monotonic_ns();
  int lrc = 0;
  if (rc == 0 && lock) {
    PINS_RANGE("pins::register");
    lrc = backend_->lock(p, esize);
  }
  const int64_t t2 = monotonic_ns();
  if (lrc != 0) warn_refused_lock(esize, lrc);
  mu_.lock();
  committing_ -= esize;
  stats_.commit_ns += t1 - t0;
  if (rc != 0) {
    add_range(addr, esize, seg);
    return Committed::Refused;
  }
  const bool locked = lock && lrc == 0;
  if (lrc != 0) stats_.lock_failures++;
  stats_.commits++;
  stats_.committed_bytes.increase(static_cast<int64_t>(esize));
  if (locked) {
    stats_.registrations++;
    stats_.lock_ns += t2 - t1;
    stats_.locked_bytes.increase(static_cast<int64_t>(esize));
  }
  auto e = std::make_unique<Extent>(Extent{addr, esize, seg, locked});
  Extent* ep = e.get();
  extents_.emplace(addr, std::move(e));
  // Listed as a free, idle extent like any other, then taken by the next
  // take_free() under the same lock hold.
  list_idle(ep);
  return lock && !locked ? Committed::Unlocked : Committed::Done;
}

void HostPool::list_idle(Extent* e) {
  auto b = std::make_unique<Block>();
  b->addr = e->base;
  b->size = e->size;
  b->ext = e;
  free_[e->locked].insert({b->size, b->addr});
  blocks_.emplace(b->addr, std::move(b));
  e->idle_since = ++clock_;
  idle_.insert({e->idle_since, e});
  idle_bytes_ += e->size;
}

void HostPool::add_range(uintptr_t addr, size_t size, Segment* seg) {
  seg->free_space += size;
  auto next = ranges_.lower_bound(addr);
  if (next != ranges_.end() && next->second.seg == seg && addr + size == next->first) {
    size += next->second.size;
    ranges_by_size_.erase({next->second.size, next->first});
    next = ranges_.erase(next);
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second.seg == seg && prev->first + prev->second.size == addr) {
      ranges_by_size_.erase({prev->second.size, prev->first});
      addr = prev->first;
      size += prev->second.size;
      ranges_.erase(prev);
    }
  }
  ranges_.emplace(addr, Range{size, seg});
  ranges_by_size_.insert({size, addr});
}

bool HostPool::take_range(size_t size, uintptr_t* addr, Segment** seg) {
  auto it = ranges_by_size_.lower_bound({size, 0});
  if (it == ranges_by_size_.end()) return false;
  const auto [rsize, raddr] = *it;
  ranges_by_size_.erase(it);
  Range r = ranges_.at(raddr);
  ranges_.erase(raddr);
  r.seg->free_space -= rsize;
  if (rsize > size) add_range(raddr + size, rsize - size, r.seg);
  *addr = raddr;
  *seg = r.seg;
  return true;
}

void HostPool::warn_refused_lock(size_t bytes, int err) {
  warn_once(warned_lock_, detail::cat("the ", backend_->name(), " backend refused to page-lock ", bytes,
                                      " bytes (error ", err, "); pins serves such pins from unlocked memory, "
                                      "which copies to a device more slowly (counted in stats()['lock_failures'])"));
}

}  // namespace pins
