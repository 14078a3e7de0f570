// A copy of the host pool's bookkeeping (HostPool::snapshot()), and the check of
// its invariants. Like PyTorch's allocator snapshots it is a plain value: a test
// can take one, break it on purpose and see check_snapshot() name the fault.
//
// Note [Host pool invariants]
// Under the pool's lock (Note [Host pool layout] names the parts):
//  - segments: reserved_bytes is the sum of their sizes; every free range lies
//    inside its segment, no two overlap, two ranges of one segment never touch
//    (they coalesce), ranges_by_size lists exactly the ranges, and each
//    segment's free_space is the sum of its ranges;
//  - extents lie inside their segment, page-aligned, overlapping neither each
//    other nor a free range; the segments' used space (size - free_space) is the
//    sum of the extents plus the bytes being committed; committed_bytes is the
//    sum of the extents and locked_bytes the sum of those locked (or between the
//    two lock holds of an unlock()), prewarmed_bytes the sum of the prewarmed
//    extents;
//  - an extent larger than extent_min holds at most one block in use: a
//    large request's own, which no other request shares (Note [Idle extents
//    are not cut], pool.h);
//  - blocks tile each extent exactly: from the extent's base, following next,
//    each block starts where the previous one ends, prev points back, the last
//    ends at the extent's end, and every block belongs to one such chain; no
//    two free blocks are neighbours (they coalesce); an extent being
//    decommitted or being locked has no blocks; a prewarmed extent is idle,
//    unlocked and neither being unlocked nor locked;
//  - the free sets list exactly the free blocks, each in the set of its
//    extent's lock state; an extent's `used` counts its allocated and parked
//    blocks; the idle set lists exactly the extents with none (not being
//    decommitted or locked), each as one free block, and idle_bytes is their
//    sum;
//  - allocated_bytes, requested_bytes and blocks are the sums over allocated
//    blocks; parked blocks are those in the parked list plus those a reap()
//    holds between its two lock holds;
//  - Note [Copies from a block]: a free block has no copy begun and no fence;
//    the copies level is the sum of the blocks' begun copies; no block of an
//    extent being unlocked has a copy begun (unlock() refuses one, and
//    begin_copy() refuses while it runs);
//  - Note [Adopted blocks] (pool.h): adopted extents are whole pages outside
//    every segment, overlapping no other; each is exactly one block, allocated
//    or parked, requested whole, counted as used once, in no free or idle set,
//    except while being locked (by adopt()) or retiring (freed, its unlock and
//    release in flight), when it has no block; never prewarmed or decommitting,
//    never retiring and being unlocked at once. adopted_bytes and
//    adopted_blocks are their sum and count; locked_bytes counts those locked
//    (or being unlocked) too; they count in no other level but copies, and
//    their parked blocks are in the parked list (or a reap's hands) as any.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "csrc/pool/stats.h"

namespace pins {

enum class BlockState { Free, Allocated, Parked };

struct PoolSnapshot {
  struct Segment {
    uintptr_t base = 0;
    size_t size = 0;
    size_t free_space = 0;  // bytes of it in free ranges
  };
  struct Range {  // uncommitted free address space
    uintptr_t addr = 0;
    size_t size = 0;
    uintptr_t segment = 0;  // base of its segment
  };
  struct Extent {
    uintptr_t base = 0;
    size_t size = 0;
    uintptr_t segment = 0;
    bool locked = false;
    bool unlocking = false;     // an unlock() is between its two lock holds
    bool decommitting = false;  // picked for decommit, backend calls in flight
    size_t used = 0;            // allocated and parked blocks
    uint64_t idle_since = 0;
    bool prewarmed = false;     // committed ahead of need, not cut yet (Note [Host pool layout])
    bool locking = false;       // its lock() in flight: cut from prewarmed memory, or adopted
    bool retiring = false;      // adopted, freed: its unlock and release in flight
  };
  struct Block {
    uintptr_t addr = 0;
    size_t size = 0;
    size_t requested = 0;
    uintptr_t extent = 0;  // base of its extent
    uintptr_t prev = 0;    // address neighbours in the extent; 0: none
    uintptr_t next = 0;
    BlockState state = BlockState::Free;
    int copies = 0;     // begin_copy() without its end_copy()
    size_t fences = 0;  // fences recorded and not yet dropped
  };

  size_t page = 0;
  size_t alignment = 0;
  size_t extent_min = 0;  // PoolOptions::extent_min in whole pages
  std::vector<Segment> segments;                         // by base
  std::vector<Range> ranges;                             // by address
  std::vector<std::pair<size_t, uintptr_t>> ranges_by_size;
  std::vector<Extent> extents;                           // by base
  std::vector<Extent> adopted;                           // by base; segment 0 (Note [Adopted blocks])
  std::vector<Block> blocks;                             // by address
  std::vector<std::pair<size_t, uintptr_t>> free[2];     // (size, addr) of free blocks; [locked]
  std::vector<std::pair<uint64_t, uintptr_t>> idle;      // (idle_since, extent base)
  std::vector<uintptr_t> parked;                         // addresses of parked blocks
  size_t idle_bytes = 0;
  size_t committing = 0;  // bytes taken from the free ranges, commit in flight
  size_t reaping = 0;     // parked blocks a reap() holds between its lock holds
  PoolStats stats;
};

// Throws std::logic_error naming the first broken invariant of Note [Host pool
// invariants] (which part, its address and the numbers that disagree).
void check_snapshot(const PoolSnapshot& s);

}  // namespace pins
