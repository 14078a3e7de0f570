// Note [Fences protect blocks] and Note [Copies from a block] (pool.h): what
// keeps a block out of reuse, and its extent page-locked, while a copy reads it.
#include <algorithm>

#include "csrc/base/check.h"
#include "csrc/pool/pool_records.h"

namespace pins {

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

}  // namespace pins
