#include "csrc/pool/pool.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"
#include "csrc/base/nvtx.h"

namespace pins {

struct HostPool::Segment {
  uintptr_t base;
  size_t size;
  size_t free_space;  // bytes of this segment in ranges_
};

struct HostPool::Extent {
  uintptr_t base;
  size_t size;
  Segment* seg;
  bool locked;
  size_t used = 0;      // blocks allocated or parked
  uint64_t idle_since = 0;
  bool unlocking = false;     // an unlock() is between its two lock holds
  bool decommitting = false;  // picked by pick_idle(); decommit() owns it until it relocks
  bool prewarmed = false;     // committed by prewarm(), idle and unlocked, not cut yet
  bool locking = false;       // its lock() in flight: no block, in no list (a cut of prewarmed memory, or adopted)
  // Note [Adopted blocks]: in adopted_, not extents_; no segment; one block.
  bool adopted = false;
  bool retiring = false;  // adopted, its block freed and forgotten: unlock and release in flight
  std::function<void()> release = nullptr;  // adopted: called once it is retired
};

struct HostPool::Block {
  uintptr_t addr;
  size_t size;          // aligned; blocks tile their extent
  size_t requested = 0;
  Extent* ext;
  Block* prev = nullptr;  // address neighbours in the same extent
  Block* next = nullptr;
  BlockState state = BlockState::Free;
  std::vector<std::shared_ptr<Fence>> fences;
  int copies = 0;            // begin_copy() without its end_copy() (Note [Copies from a block])
  uint64_t fence_adds = 0;   // fences ever added; a reap() sees whether its copy of the list is current
};

HostPool::HostPool(std::unique_ptr<HostBackend> backend, PoolOptions options)
    : backend_(std::move(backend)),
      opts_(options),
      page_(backend_->page_size()),
      align_(std::max<size_t>(options.alignment, 1)),
      can_lock_(backend_->can_lock()),
      cap_(options.cap),
      retain_free_(options.retain_free) {
  PINS_CHECK_VALUE((align_ & (align_ - 1)) == 0 && align_ <= page_,
                   "pool alignment must be a power of two no larger than the page size (", page_, "), got ",
                   align_);
  PINS_CHECK_VALUE(options.segment_size <= kMaxAllocation, "pool segment_size must be at most 2^48 bytes, got ",
                   options.segment_size);
  PINS_CHECK_VALUE(options.extent_min <= kMaxAllocation, "pool extent_min must be at most 2^48 bytes, got ",
                   options.extent_min);
  stats_.backend = backend_->name();
}

HostPool::~HostPool() {
  // Note [Adopted blocks]: released here whether freed or not.
  for (auto& [base, e] : adopted_) {
    if (e->locked) backend_->unlock(reinterpret_cast<void*>(e->base), e->size);
    if (e->release) e->release();
  }
  for (auto& [base, e] : extents_) {
    if (e->locked) backend_->unlock(reinterpret_cast<void*>(e->base), e->size);
    backend_->decommit(reinterpret_cast<void*>(e->base), e->size);
  }
  for (auto& [base, s] : segments_) backend_->release(reinterpret_cast<void*>(s->base), s->size);
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

HostPool::Block* HostPool::take_free(size_t asize, bool locked) {
  auto& set = free_[locked];
  auto it = set.lower_bound({asize, 0});
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

void* HostPool::try_allocate(size_t size, bool lock) {
  PINS_CHECK_VALUE(size > 0, "pool allocation size must be positive, got ", size);
  // Past this bound round_align() and round_page() could wrap (SIZE_MAX - 511
  // would round to 0); below it no sum of the pool's sizes comes near 2^64.
  PINS_CHECK_VALUE(size <= kMaxAllocation, "pool allocation size must be at most 2^48 bytes, got ", size);
  const bool want_lock = lock && can_lock_;
  const size_t asize = round_align(size);
  const size_t need = round_page(asize);
  reap();

  MutexLock g(mu_);
  for (;;) {
    if (Block* b = take_free(asize, want_lock)) return finish(b, size);

    // Note [Host pool layout]: a locked request locks a cut of prewarmed memory.
    if (want_lock) {
      if (Extent* pre = find_prewarmed(need)) {
        Extent* e = take_prewarmed(pre, std::min(pre->size, extent_size(need)));
        e->locking = true;
        g.unlock();
        int64_t t0 = 0, t1 = 0;
        int lrc = 0;
        {
          PINS_RANGE("pins::register");
          t0 = monotonic_ns();
          lrc = backend_->lock(reinterpret_cast<void*>(e->base), e->size);
          t1 = monotonic_ns();
        }
        g.lock();
        e->locking = false;
        if (lrc != 0) {
          stats_.lock_failures++;
          stats_.refusals++;
          list_idle(e);  // committed, unlocked and idle: reused or decommitted like any other
          return nullptr;
        }
        e->locked = true;
        stats_.registrations++;
        stats_.lock_ns += t1 - t0;
        stats_.locked_bytes.increase(static_cast<int64_t>(e->size));
        list_idle(e);
        Block* got = take_free(asize, true);
        PINS_ASSERT(got != nullptr);
        return finish(got, size);
      }
    }

    // A new extent: at least extent_min, but never more than the cap allows.
    if (cap_ != 0 && stats_.committed_bytes.current + committing_ + need > cap_) {
      const size_t over = stats_.committed_bytes.current + committing_ + need - cap_;
      std::vector<Extent*> victims = pick_idle(over);
      if (victims.empty()) {
        stats_.refusals++;
        return nullptr;
      }
      g.unlock();
      decommit(std::move(victims));
      g.lock();
      continue;
    }
    // Requests up to half an extent share extent_min extents (a tail that small
    // requests fill); larger ones get an exact extent, so the tail never strands.
    const size_t emin = round_page(opts_.extent_min);
    size_t esize = 2 * need <= emin ? emin : need;
    // Whole pages of what the cap leaves (a cap such as 1MB = 10^6 is no
    // multiple of the page; the check above left at least `need`, itself whole
    // pages): an extent is always page-aligned (Note [Host backend contract]).
    if (cap_ != 0) esize = std::min(esize, (cap_ - stats_.committed_bytes.current - committing_) & ~(page_ - 1));
    uintptr_t addr = 0;
    Segment* seg = nullptr;
    if (!take_range(esize, &addr, &seg)) {
      if (esize > need && take_range(need, &addr, &seg)) {
        esize = need;
      } else {
        // Reserve a segment; mmap runs unlocked.
        const size_t ssize = std::max(round_page(opts_.segment_size), need);
        g.unlock();
        void* p = nullptr;
        const int rc = backend_->reserve(ssize, &p);
        g.lock();
        if (rc != 0) {
          stats_.refusals++;
          return nullptr;
        }
        auto s = std::make_unique<Segment>(Segment{reinterpret_cast<uintptr_t>(p), ssize, 0});
        Segment* sp = s.get();
        segments_.emplace(sp->base, std::move(s));
        stats_.segments++;
        stats_.reserved_bytes.increase(static_cast<int64_t>(ssize));
        add_range(sp->base, ssize, sp);
        continue;
      }
    }

    committing_ += esize;
    g.unlock();
    void* p = reinterpret_cast<void*>(addr);
    const int64_t t0 = monotonic_ns();
    int rc = backend_->commit(p, esize);
    const int64_t t1 = monotonic_ns();
    int lrc = 0;
    if (rc == 0 && want_lock) {
      PINS_RANGE("pins::register");
      lrc = backend_->lock(p, esize);
      if (lrc != 0) backend_->decommit(p, esize);
    }
    const int64_t t2 = monotonic_ns();
    g.lock();
    committing_ -= esize;
    stats_.commit_ns += t1 - t0;
    if (rc != 0 || lrc != 0) {
      if (lrc != 0) stats_.lock_failures++;
      add_range(addr, esize, seg);
      stats_.refusals++;
      return nullptr;
    }
    stats_.commits++;
    stats_.committed_bytes.increase(static_cast<int64_t>(esize));
    if (want_lock) {
      stats_.registrations++;
      stats_.lock_ns += t2 - t1;
      stats_.locked_bytes.increase(static_cast<int64_t>(esize));
    }
    auto e = std::make_unique<Extent>(Extent{addr, esize, seg, want_lock});
    auto b = std::make_unique<Block>();
    b->addr = addr;
    b->size = esize;
    b->ext = e.get();
    Block* bp = b.get();
    extents_.emplace(addr, std::move(e));
    blocks_.emplace(addr, std::move(b));
    // Listed as a free, idle extent like any other, then taken at once under the
    // same lock hold.
    free_[want_lock].insert({bp->size, bp->addr});
    bp->ext->idle_since = ++clock_;
    idle_.insert({bp->ext->idle_since, bp->ext});
    idle_bytes_ += esize;
    Block* got = take_free(asize, want_lock);
    PINS_ASSERT(got != nullptr);
    return finish(got, size);
  }
}

void* HostPool::allocate(size_t size, bool lock) {
  if (void* p = try_allocate(size, lock)) return p;
  const PoolStats s = stats();
  throw ResourceError(detail::cat("pins host pool refused an allocation of ", size, " bytes: cap ", cap(),
                                  " bytes, committed ", s.committed_bytes.current, " bytes, allocated ",
                                  s.allocated_bytes.current, " bytes (backend ", s.backend, ")"));
}

HostPool::Block* HostPool::find(void* ptr, const char* what) const {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  PINS_CHECK_VALUE(it != blocks_.end() && it->second->state == BlockState::Allocated, what, ": pointer ", ptr,
                   " is not a live allocation of this pool");
  return it->second.get();
}

HostPool::Block* HostPool::find_copying(void* ptr, const char* what) const {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  PINS_CHECK_VALUE(it != blocks_.end() && it->second->state != BlockState::Free && it->second->copies > 0, what,
                   ": pointer ", ptr, " is not a block of this pool with a copy begun (begin_copy)");
  return it->second.get();
}

void HostPool::release(Block* b) {
  b->state = BlockState::Free;
  b->fences.clear();
  Extent* e = b->ext;
  e->used--;
  auto& set = free_[e->locked];
  if (Block* n = b->next; n && n->state == BlockState::Free) {
    set.erase({n->size, n->addr});
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    blocks_.erase(n->addr);
  }
  if (Block* p = b->prev; p && p->state == BlockState::Free) {
    set.erase({p->size, p->addr});
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    blocks_.erase(b->addr);
    b = p;
  }
  set.insert({b->size, b->addr});
  if (e->used == 0) {
    e->idle_since = ++clock_;
    idle_.insert({e->idle_since, e});
    idle_bytes_ += e->size;
  }
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

HostPool::Extent* HostPool::split_prewarmed(Extent* e, size_t esize) {
  PINS_ASSERT(e->prewarmed && e->used == 0 && esize > 0 && esize <= e->size && esize % page_ == 0);
  free_[0].erase({e->size, e->base});
  idle_.erase({e->idle_since, e});
  idle_bytes_ -= e->size;
  blocks_.erase(e->base);
  e->prewarmed = false;
  if (e->size > esize) {
    auto rest = std::make_unique<Extent>(Extent{e->base + esize, e->size - esize, e->seg, false});
    rest->prewarmed = true;
    Extent* r = rest.get();
    extents_.emplace(r->base, std::move(rest));
    e->size = esize;
    list_idle(r);
  }
  stats_.prewarmed_bytes.decrease(static_cast<int64_t>(esize));
  return e;
}

HostPool::Extent* HostPool::take_prewarmed(Extent* e, size_t esize) {
  split_prewarmed(e, esize);
  stats_.prewarm_served++;
  stats_.prewarm_served_bytes += static_cast<int64_t>(esize);
  return e;
}

HostPool::Extent* HostPool::find_prewarmed(size_t bytes) const {
  Extent* best = nullptr;
  for (const auto& [since, e] : idle_)
    if (e->prewarmed && e->size >= bytes && (best == nullptr || e->size < best->size)) best = e;
  return best;
}

void HostPool::join_extents(Extent* a, Extent* b) {
  for (Extent* x : {a, b}) {
    free_[0].erase({x->size, x->base});
    idle_.erase({x->idle_since, x});
    idle_bytes_ -= x->size;
    blocks_.erase(x->base);
  }
  a->size += b->size;
  extents_.erase(b->base);  // destroys b
  list_idle(a);
}

HostPool::Extent* HostPool::join_prewarmed(Extent* e) {
  auto it = extents_.find(e->base);
  if (auto next = std::next(it); next != extents_.end()) {
    Extent* n = next->second.get();
    if (n->prewarmed && n->seg == e->seg && n->base == e->base + e->size) join_extents(e, n);
  }
  it = extents_.find(e->base);
  if (it != extents_.begin()) {
    Extent* p = std::prev(it)->second.get();
    if (p->prewarmed && p->seg == e->seg && p->base + p->size == e->base) {
      join_extents(p, e);
      e = p;
    }
  }
  return e;
}

size_t HostPool::prewarm(size_t bytes) {
  PINS_CHECK_VALUE(bytes > 0 && bytes <= kMaxAllocation, "HostPool::prewarm: bytes must be from 1 to 2^48, got ",
                   bytes);
  const size_t esize = round_page(bytes);
  MutexLock g(mu_);
  uintptr_t addr = 0;
  Segment* seg = nullptr;
  for (;;) {
    if (cap_ != 0 && stats_.committed_bytes.current + committing_ + esize > cap_) return 0;
    // Continue the last prewarmed extent where its segment is free after it, so
    // the two join (Note [Host pool layout]); else the best fit, as a commit does.
    auto at = ranges_.find(prewarm_end_);
    if (at != ranges_.end() && at->second.size >= esize) {
      const Range r = at->second;
      ranges_by_size_.erase({r.size, at->first});
      ranges_.erase(at);
      r.seg->free_space -= r.size;
      addr = prewarm_end_;
      seg = r.seg;
      if (r.size > esize) add_range(addr + esize, r.size - esize, seg);
      break;
    }
    if (take_range(esize, &addr, &seg)) break;
    const size_t ssize = std::max(round_page(opts_.segment_size), esize);
    g.unlock();
    void* p = nullptr;
    const int rc = backend_->reserve(ssize, &p);
    g.lock();
    if (rc != 0) return 0;
    auto s = std::make_unique<Segment>(Segment{reinterpret_cast<uintptr_t>(p), ssize, 0});
    Segment* sp = s.get();
    segments_.emplace(sp->base, std::move(s));
    stats_.segments++;
    stats_.reserved_bytes.increase(static_cast<int64_t>(ssize));
    add_range(sp->base, ssize, sp);
  }
  committing_ += esize;
  g.unlock();
  const int64_t t0 = monotonic_ns();
  int rc = 0;
  {
    PINS_RANGE("pins::prewarm");
    rc = backend_->commit(reinterpret_cast<void*>(addr), esize);
  }
  const int64_t t1 = monotonic_ns();
  g.lock();
  committing_ -= esize;
  if (rc != 0) {
    add_range(addr, esize, seg);
    return 0;
  }
  stats_.prewarms++;
  stats_.prewarm_ns += t1 - t0;
  stats_.committed_bytes.increase(static_cast<int64_t>(esize));
  stats_.prewarmed_bytes.increase(static_cast<int64_t>(esize));
  auto e = std::make_unique<Extent>(Extent{addr, esize, seg, false});
  e->prewarmed = true;
  Extent* ep = e.get();
  extents_.emplace(addr, std::move(e));
  list_idle(ep);
  join_prewarmed(ep);
  prewarm_end_ = addr + esize;
  return esize;
}

std::vector<HostPool::Extent*> HostPool::pick_idle(size_t over) {
  // Oldest idle extents first: the most recently freed are the likeliest reused.
  std::vector<Extent*> victims;
  size_t got = 0;
  for (auto it = idle_.begin(); got < over && it != idle_.end();) {
    Extent* e = it->second;
    if (e->unlocking) {  // unlock() owns it for now
      ++it;
      continue;
    }
    if (e->prewarmed && e->size > round_page(over - got)) {
      // Note [Host pool layout]: only what is over the limit; the rest stays prewarmed.
      split_prewarmed(e, round_page(over - got));
      e->decommitting = true;
      got += e->size;
      victims.push_back(e);
      break;
    }
    it = idle_.erase(it);
    idle_bytes_ -= e->size;
    free_[e->locked].erase({e->size, e->base});
    blocks_.erase(e->base);
    e->decommitting = true;
    if (e->prewarmed) {
      e->prewarmed = false;
      stats_.prewarmed_bytes.decrease(static_cast<int64_t>(e->size));
    }
    got += e->size;
    victims.push_back(e);
  }
  return victims;
}

void HostPool::decommit(std::vector<Extent*> victims) {
  // The victims are in no list but extents_ and marked decommitting: nobody
  // else touches them while unlocked.
  struct Done {
    Extent* e;
    bool unlocked;
    int64_t unlock_ns;
  };
  std::vector<Done> done;
  for (Extent* e : victims) {
    void* p = reinterpret_cast<void*>(e->base);
    PINS_RANGE("pins::decommit");
    const int64_t t0 = monotonic_ns();
    const bool unlocked = e->locked && backend_->unlock(p, e->size) == 0;
    const int64_t t1 = monotonic_ns();
    if (!e->locked || unlocked) backend_->decommit(p, e->size);
    done.push_back({e, unlocked, t1 - t0});
  }
  std::vector<std::pair<void*, size_t>> to_release;
  {
    MutexLock g(mu_);
    for (const Done& d : done) {
      Extent* e = d.e;
      if (e->locked && !d.unlocked) {
        // The driver refused to unlock: the memory stays committed; keep it as
        // an idle extent rather than lose track of it.
        stats_.lock_failures++;
        e->decommitting = false;
        list_idle(e);
        continue;
      }
      if (e->locked) {
        stats_.unregistrations++;
        stats_.unlock_ns += d.unlock_ns;
        stats_.locked_bytes.decrease(static_cast<int64_t>(e->size));
      }
      stats_.decommits++;
      stats_.committed_bytes.decrease(static_cast<int64_t>(e->size));
      Segment* seg = e->seg;
      add_range(e->base, e->size, seg);
      extents_.erase(e->base);
      if (seg->free_space == seg->size) {
        ranges_by_size_.erase({seg->size, seg->base});
        ranges_.erase(seg->base);
        stats_.reserved_bytes.decrease(static_cast<int64_t>(seg->size));
        to_release.emplace_back(reinterpret_cast<void*>(seg->base), seg->size);
        segments_.erase(seg->base);
      }
    }
  }
  for (auto [p, n] : to_release) backend_->release(p, n);
}

void HostPool::free(void* ptr) {
  std::vector<Extent*> victims;
  std::vector<Extent*> retired;
  {
    MutexLock g(mu_);
    Block* b = find(ptr, "HostPool::free");
    if (b->ext->adopted) {
      // Note [Adopted blocks]: not counted as an allocation's free; an unlock()
      // between its lock holds still uses the extent.
      if (!b->fences.empty() || b->copies > 0 || b->ext->unlocking) {
        b->state = BlockState::Parked;
        parked_.push_back(b);
        return;
      }
      retire(b, retired);
    } else {
      stats_.frees++;
      stats_.allocated_bytes.decrease(static_cast<int64_t>(b->size));
      stats_.requested_bytes.decrease(static_cast<int64_t>(b->requested));
      stats_.blocks.decrease(1);
      if (!b->fences.empty() || b->copies > 0) {
        b->state = BlockState::Parked;
        parked_.push_back(b);
        stats_.deferred_frees++;
        return;
      }
      release(b);
      if (idle_bytes_ > retain_free_) victims = pick_idle(idle_bytes_ - retain_free_);
    }
  }
  if (!retired.empty()) release_adopted(std::move(retired));
  if (!victims.empty()) decommit(std::move(victims));
}

void HostPool::reap() {
  struct Held {
    Block* b;
    std::vector<std::shared_ptr<Fence>> fences;
    uint64_t fence_adds;
  };
  std::vector<Held> snap;
  {
    MutexLock g(mu_);
    if (parked_.empty()) return;
    for (Block* b : parked_) snap.push_back({b, b->fences, b->fence_adds});
    parked_.clear();
    reaping_ += snap.size();
  }
  std::vector<bool> ready(snap.size());
  for (size_t i = 0; i < snap.size(); ++i)
    ready[i] = std::all_of(snap[i].fences.begin(), snap[i].fences.end(),
                           [](const std::shared_ptr<Fence>& f) { return f->done(); });
  std::vector<Extent*> victims;
  std::vector<Extent*> retired;
  {
    MutexLock g(mu_);
    reaping_ -= snap.size();
    for (size_t i = 0; i < snap.size(); ++i) {
      // An end_copy() meanwhile may have added a fence this reap did not query.
      Block* b = snap[i].b;
      const bool done = ready[i] && b->copies == 0 && b->fence_adds == snap[i].fence_adds;
      if (done && !b->ext->adopted) release(b);
      else if (done && !b->ext->unlocking) retire(b, retired);  // Note [Adopted blocks]
      else parked_.push_back(b);
    }
    if (idle_bytes_ > retain_free_) victims = pick_idle(idle_bytes_ - retain_free_);
  }
  if (!retired.empty()) release_adopted(std::move(retired));
  if (!victims.empty()) decommit(std::move(victims));
  // snap's fences are destroyed here, unlocked.
}

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

void HostPool::record_fence(void* ptr, std::shared_ptr<Fence> fence) {
  PINS_CHECK_VALUE(fence != nullptr, "HostPool::record_fence: fence must not be null");
  add_fence(ptr, std::move(fence), /*ends_copy=*/false, "HostPool::record_fence");
}

void HostPool::add_fence(void* ptr, std::shared_ptr<Fence> fence, bool ends_copy, const char* what) {
  // Note [Fences protect blocks]: the fences stay on the block while queried.
  std::vector<std::shared_ptr<Fence>> old;
  {
    MutexLock g(mu_);
    old = (ends_copy ? find_copying(ptr, what) : find(ptr, what))->fences;
  }
  // Drop the fences that completed, so a block copied every step keeps a short list.
  std::vector<const Fence*> done;
  for (const auto& f : old)
    if (f->done()) done.push_back(f.get());
  std::vector<std::shared_ptr<Fence>> dropped;  // destroyed after the lock is released
  MutexLock g(mu_);
  Block* b = ends_copy ? find_copying(ptr, what) : find(ptr, what);
  auto& fs = b->fences;
  for (auto it = fs.begin(); it != fs.end();) {
    if (std::find(done.begin(), done.end(), it->get()) != done.end()) {
      dropped.push_back(std::move(*it));
      it = fs.erase(it);
    } else {
      ++it;
    }
  }
  fs.push_back(std::move(fence));
  b->fence_adds++;
  if (ends_copy) {
    b->copies--;
    stats_.copies.decrease(1);
  }
}

bool HostPool::in_flight(void* ptr) {
  std::vector<std::shared_ptr<Fence>> fences;
  {
    MutexLock g(mu_);
    Block* b = find(ptr, "HostPool::in_flight");
    if (b->copies > 0) return true;
    fences = b->fences;
  }
  return std::any_of(fences.begin(), fences.end(), [](const std::shared_ptr<Fence>& f) { return !f->done(); });
}

bool HostPool::begin_copy(void* ptr) {
  MutexLock g(mu_);
  Block* b = find(ptr, "HostPool::begin_copy");
  if (b->ext->unlocking) {
    stats_.copy_refusals++;
    return false;
  }
  b->copies++;
  stats_.copies.increase(1);
  return true;
}

void HostPool::end_copy(void* ptr, std::shared_ptr<Fence> fence) {
  if (fence != nullptr) {
    add_fence(ptr, std::move(fence), /*ends_copy=*/true, "HostPool::end_copy");
    return;
  }
  {
    MutexLock g(mu_);
    Block* b = find_copying(ptr, "HostPool::end_copy");
    b->copies--;
    stats_.copies.decrease(1);
  }
  // A block freed during its copy is parked; the next reap() returns it.
}

size_t HostPool::retain_free() const {
  MutexLock g(mu_);
  return retain_free_;
}

void HostPool::set_retain_free(size_t bytes) {
  MutexLock g(mu_);
  retain_free_ = bytes;
}

size_t HostPool::idle_bytes() const {
  MutexLock g(mu_);
  return idle_bytes_;
}

size_t HostPool::committed_bytes() const {
  MutexLock g(mu_);
  return static_cast<size_t>(stats_.committed_bytes.current);
}

size_t HostPool::trim(size_t keep_idle) {
  reap();
  std::vector<Extent*> victims;
  size_t bytes = 0;
  {
    MutexLock g(mu_);
    if (idle_bytes_ > keep_idle) victims = pick_idle(idle_bytes_ - keep_idle);
    for (Extent* e : victims) bytes += e->size;
  }
  if (!victims.empty()) decommit(std::move(victims));
  return bytes;
}

size_t HostPool::requested_size(void* ptr) const {
  MutexLock g(mu_);
  return find(ptr, "HostPool::requested_size")->requested;
}

bool HostPool::is_locked(void* ptr) const {
  MutexLock g(mu_);
  return find(ptr, "HostPool::is_locked")->ext->locked;
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

size_t HostPool::cap() const {
  MutexLock g(mu_);
  return cap_;
}

void HostPool::set_cap(size_t cap) {
  MutexLock g(mu_);
  cap_ = cap;
}

PoolStats HostPool::stats() const {
  MutexLock g(mu_);
  return stats_;
}

void HostPool::reset_accumulated() {
  MutexLock g(mu_);
  stats_.reset_accumulated();
}

void HostPool::reset_peak() {
  MutexLock g(mu_);
  stats_.reset_peak();
}

PoolSnapshot HostPool::snapshot() const {
  PoolSnapshot out;
  out.page = page_;
  out.alignment = align_;
  MutexLock g(mu_);
  for (const auto& [base, seg] : segments_) out.segments.push_back({seg->base, seg->size, seg->free_space});
  for (const auto& [addr, r] : ranges_) out.ranges.push_back({addr, r.size, r.seg->base});
  out.ranges_by_size.assign(ranges_by_size_.begin(), ranges_by_size_.end());
  for (const auto& [base, e] : extents_)
    out.extents.push_back({e->base, e->size, e->seg->base, e->locked, e->unlocking, e->decommitting, e->used,
                           e->idle_since, e->prewarmed, e->locking, e->retiring});
  for (const auto& [addr, b] : blocks_)
    out.blocks.push_back({b->addr, b->size, b->requested, b->ext->base, b->prev ? b->prev->addr : 0,
                          b->next ? b->next->addr : 0, b->state, b->copies, b->fences.size()});
  std::sort(out.blocks.begin(), out.blocks.end(),
            [](const PoolSnapshot::Block& a, const PoolSnapshot::Block& b) { return a.addr < b.addr; });
  for (int k = 0; k < 2; ++k) out.free[k].assign(free_[k].begin(), free_[k].end());
  for (const auto& [since, e] : idle_) out.idle.emplace_back(since, e->base);
  for (const auto& [base, e] : adopted_)
    out.adopted.push_back({e->base, e->size, 0, e->locked, e->unlocking, e->decommitting, e->used, e->idle_since,
                           e->prewarmed, e->locking, e->retiring});
  for (const Block* b : parked_) out.parked.push_back(b->addr);
  out.idle_bytes = idle_bytes_;
  out.committing = committing_;
  out.reaping = reaping_;
  out.stats = stats_;
  return out;
}

void HostPool::check_invariants() const { check_snapshot(snapshot()); }

}  // namespace pins
