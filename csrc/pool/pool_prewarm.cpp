// Prewarmed extents (Note [Host pool layout]; Note [Prewarm] in
// csrc/balancer/prewarm.h): committed by prewarm() ahead of need, joined with
// their neighbours, cut to what a request, a decommit or trim() takes.
#include <algorithm>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"
#include "csrc/base/nvtx.h"
#include "csrc/pool/pool_records.h"

namespace pins {

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

bool HostPool::take_prewarm_space(size_t esize, uintptr_t* addr, Segment** seg) {
  // Continue the last prewarmed extent where its segment is free after it, so
  // the two join (Note [Host pool layout]); else the best fit, as a commit does.
  auto at = ranges_.find(prewarm_end_);
  if (at != ranges_.end() && at->second.size >= esize) {
    const Range r = at->second;
    ranges_by_size_.erase({r.size, at->first});
    ranges_.erase(at);
    r.seg->free_space -= r.size;
    *addr = prewarm_end_;
    *seg = r.seg;
    if (r.size > esize) add_range(*addr + esize, r.size - esize, r.seg);
    return true;
  }
  return take_range(esize, addr, seg);
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
    if (take_prewarm_space(esize, &addr, &seg)) break;
    if (!reserve_segment(esize)) return 0;
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

}  // namespace pins
