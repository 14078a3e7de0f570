// The host pool (Note [Host pool layout] in pool.h): construction and
// destruction, lookups, the retain limit and the cap, stats and snapshots.
// pool_records.h lists the files that hold the rest.
#include <algorithm>

#include "csrc/base/check.h"
#include "csrc/pool/pool_records.h"

namespace pins {

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

size_t HostPool::requested_size(void* ptr) const {
  MutexLock g(mu_);
  return find(ptr, "HostPool::requested_size")->requested;
}

bool HostPool::is_locked(void* ptr) const {
  MutexLock g(mu_);
  return find(ptr, "HostPool::is_locked")->ext->locked;
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
  out.extent_min = shared_extent();
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
