// The records of the host pool's bookkeeping (Note [Host pool layout] in
// pool.h): private to csrc/pool/pool*.cpp, the files HostPool is written in.
// Each file holds one concern of the pool:
//   pool.cpp          construction, lookups, the retain limit and cap, stats, snapshot
//   pool_allocate.cpp try_allocate(), step by step; free address space and segments
//   pool_free.cpp     free(), reap(), and decommitting idle extents (trim(), the retain limit, the cap)
//   pool_prewarm.cpp  prewarm() and prewarmed extents: cut, taken, joined
//   pool_adopted.cpp  Note [Adopted blocks]
//   pool_fences.cpp   Note [Fences protect blocks], Note [Copies from a block]
//   pool_locks.cpp    page-locks: a cut of prewarmed memory locked, unlock()
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "csrc/pool/fence.h"
#include "csrc/pool/pool.h"

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

}  // namespace pins
