// The host pool behind every pin.
//
// Note [Host pool layout]
// Segments are large reservations of address space (Config::segment_size, or a
// whole request when larger). Inside a segment, RAM is committed in *extents*:
// page-aligned ranges committed, and page-locked when asked, in one backend call
// each: Config::extent_min long, shared by requests up to half that size, or
// exactly the (page-rounded) request when larger. Extents are cut into *blocks* at
// Config::alignment, with no power-of-two rounding; a freed block coalesces with
// its free neighbours inside its extent. A block never spans two extents, so each
// allocation lies in a single page-locked registration (a DMA from it is never
// split across driver registrations). When every block of an extent is free the
// extent is *idle*: it stays committed (and locked) for reuse until the idle bytes
// pass Config::retain_free or trim() is called, and then it is unlocked,
// decommitted (RSS drops) and its range coalesces back into the segment's free
// address space; a segment with nothing committed is released.
//
// Note [Fences protect blocks]
// A fence recorded on a block (a copy in flight from it) keeps the block out of
// reuse: a block freed while a fence is pending is parked and only returns to the
// free lists once every fence reports done(), checked outside the lock.
//
// Locking: one mutex, mu_. Backend calls and fence queries run with it released;
// the range they work on is taken out of every free list first, so no other
// thread can see it in between.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "csrc/pool/backend.h"
#include "csrc/pool/fence.h"
#include "csrc/pool/stats.h"

namespace pins {

struct PoolOptions {
  size_t segment_size = 1ull << 30;
  size_t extent_min = 2ull << 20;
  size_t alignment = 512;    // power of two, <= page size
  size_t cap = 0;            // committed-bytes cap; 0: no cap
  size_t retain_free = 64ull << 20;

  static PoolOptions from(const Config& c);
};

class HostPool {
 public:
  HostPool(std::unique_ptr<HostBackend> backend, PoolOptions options);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A block of at least `size` bytes, page-locked when `lock` and the backend can
  // lock; nullptr when the cap or the OS refuses (nothing changed then).
  void* try_allocate(size_t size, bool lock = true);
  // As try_allocate, but a refusal throws pins::ResourceError stating the
  // request, the cap and the current use.
  void* allocate(size_t size, bool lock = true);
  // Returns a block. Throws pins::ValueError for a pointer this pool did not hand out.
  void free(void* ptr);

  // Note [Fences protect blocks]
  void record_fence(void* ptr, std::shared_ptr<Fence> fence);
  bool in_flight(void* ptr);

  // Decommits idle extents until at most `keep_idle` idle bytes remain (and
  // reaps parked blocks first). Returns the bytes decommitted.
  size_t trim(size_t keep_idle = 0);

  size_t requested_size(void* ptr) const;
  // Whether the block lies in a page-locked extent.
  bool is_locked(void* ptr) const;
  // Drops the page-lock of the extent holding `ptr` (its memory stays committed;
  // every block in that extent becomes pageable). Returns the bytes unlocked: 0
  // when it was not locked or a block in it has a copy in flight.
  size_t unlock(void* ptr);
  size_t cap() const;
  void set_cap(size_t cap);

  PoolStats stats() const;
  void reset_accumulated();
  void reset_peak();
  const HostBackend& backend() const { return *backend_; }

 private:
  struct Segment;
  struct Extent;
  struct Block;
  enum class State { Free, Allocated, Parked };
  struct Range {
    size_t size;
    Segment* seg;
  };

  void* finish(Block* b, size_t requested);  // LOCK: mu_
  Block* take_free(size_t asize, bool locked);  // LOCK: mu_
  void release(Block* b);  // LOCK: mu_
  std::vector<Extent*> pick_idle(size_t over);  // LOCK: mu_
  void decommit(std::vector<Extent*> victims);  // takes mu_ itself
  void add_range(uintptr_t addr, size_t size, Segment* seg);  // LOCK: mu_
  bool take_range(size_t size, uintptr_t* addr, Segment** seg);  // LOCK: mu_
  void reap();
  Block* find(void* ptr, const char* what) const;  // LOCK: mu_
  size_t round_align(size_t n) const { return (n + align_ - 1) & ~(align_ - 1); }
  size_t round_page(size_t n) const { return (n + page_ - 1) & ~(page_ - 1); }

  const std::unique_ptr<HostBackend> backend_;
  const PoolOptions opts_;
  const size_t page_;
  const size_t align_;
  const bool can_lock_;

  mutable std::mutex mu_;
  size_t cap_;                                                    // LOCK: mu_
  size_t committing_ = 0;                                         // LOCK: mu_ (bytes being committed)
  size_t idle_bytes_ = 0;                                         // LOCK: mu_
  uint64_t clock_ = 0;                                            // LOCK: mu_
  std::map<uintptr_t, std::unique_ptr<Segment>> segments_;        // LOCK: mu_
  std::map<uintptr_t, Range> ranges_;                             // LOCK: mu_ uncommitted free address space
  std::set<std::pair<size_t, uintptr_t>> ranges_by_size_;         // LOCK: mu_
  std::map<uintptr_t, std::unique_ptr<Extent>> extents_;          // LOCK: mu_
  std::set<std::pair<uint64_t, Extent*>> idle_;                   // LOCK: mu_ by idle age
  std::unordered_map<uintptr_t, std::unique_ptr<Block>> blocks_;  // LOCK: mu_ every block, by address
  std::set<std::pair<size_t, uintptr_t>> free_[2];                // LOCK: mu_ free blocks by size; [locked]
  std::vector<Block*> parked_;                                    // LOCK: mu_
  PoolStats stats_;                                               // LOCK: mu_
};

}  // namespace pins
