// Blocks going back: free() and reap() (a block parked while a copy or fence
// held it), and idle extents decommitted past the retain limit, by trim() and
// to make room under the cap (Note [Host pool layout]).
#include <algorithm>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"
#include "csrc/base/nvtx.h"
#include "csrc/pool/pool_records.h"

namespace pins {

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

}  // namespace pins
