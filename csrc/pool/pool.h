// The host pool behind every pin (written in csrc/pool/pool*.cpp, one concern a
// file: pool_records.h lists them).
//
// Note [Host pool layout]
// Segments are large reservations of address space (PoolOptions::segment_size,
// or a whole request when larger). Inside a segment, RAM is committed in
// *extents*: page-aligned ranges committed, and page-locked when asked, in one
// backend call each: PoolOptions::extent_min long, shared by requests up to
// half that size, or exactly the (page-rounded) request when larger. Extents
// are cut into *blocks* at PoolOptions::alignment, with no power-of-two
// rounding; a freed block coalesces with its free neighbours inside its extent.
// A block never spans two extents, so each allocation lies in a single
// page-locked registration (a DMA from it is never split across driver
// registrations). When every block of an extent is free the extent is *idle*:
// it stays committed (and locked) for reuse until the idle bytes pass the
// retain limit (PoolOptions::retain_free at first; set_retain_free() moves it:
// the balancer sets it from its budget, Note [Warm idle memory] in
// csrc/balancer/budget_gate.h) or trim() is called, and then it is unlocked,
// decommitted (RSS drops) and its range coalesces back into the segment's free
// address space; a segment with nothing committed is released.
//
// Prewarmed extents (prewarm(), Note [Prewarm] in csrc/balancer/prewarm.h) are
// idle, unlocked extents committed ahead of need. Two of them next to each
// other in one segment join into one (prewarm() commits in small steps, each
// continuing the last where the segment's free space allows), so a large
// request finds them whole. A request takes prewarmed memory cut to the extent
// it would have committed (the page-rounded request, or extent_min for one up
// to half that): the cut is an extent of its own and the rest stays prewarmed,
// so a pin never shares an extent it did not ask for, and its memory goes back
// to the OS when it does, as if committed on the spot. A request that wants a
// page-lock locks only the cut, after it is cut (the lock call runs unlocked;
// the cut is then *being locked*: in no list, with no block). Prewarmed memory
// is idle memory for everything else: it counts in idle_bytes(), and the
// retain limit, trim() and the cap's decommits give it back like any other,
// cut to what they need.
//
// Note [Idle extents are not cut]
// A request takes a block of an idle extent only when the extent is the size
// it would commit itself (extent_min for a small request, its page-rounded
// size for a larger one): it takes a free block of an extent in use, a
// prewarmed cut, an idle extent of its own size, or commits its own. Cut by a
// smaller request, an idle extent becomes an extent in use whose rest stays committed
// but is neither idle (the retain limit, trim() and the balancer's budget see
// none of it, Note [Warm idle memory]) nor free for a larger request: only
// smaller ones fit there, and freeing more pins gives back no RAM until every
// block of the extent is free. A balancer whose pins come in many sizes
// stranded that way a few hundred MiB: on pins-sim's suite scenario
// s4-20-seed-prompt-16g-16g-flux (Flux with its encoders on 16 GiB), 0.48 GiB
// of the trace policy's 8.65 GiB committed held no pin, and one 270 MiB layer
// the sampler streams every step was read from disk every step (6.6 GiB a run
// over mru). That includes an idle extent smaller than the request's own: a
// small request's own is extent_min, and an exact extent between half
// extent_min and extent_min, cut by it, strands its rest the same way (and
// the request it was made for, coming again, commits a new one: pins-bench
// alloc's warm pass, the SDXL UNet's sizes, committed again). The idle
// extents a request passes stay idle, for a request of their size or for the
// retain limit to give back; they are at most the retained ones, so the walk
// past them is bounded by what the retain limit keeps.
// Nor does any request take the free rest of a large request's extent in use
// (an extent larger than extent_min): the tail, less than a page, that rounding
// the request to whole pages left. A small pin there held the extent in use
// once the large pin was freed; a larger request then took part of its free
// block, and the rest stayed committed behind it, cut by smaller requests but
// never idle. On pins-sim's held-out u29-7 (HiDream, Flux and WAN 2.2 5B on 16
// GiB), 310 MiB of a 648 MiB Flux extent sat behind one 337 MiB HiDream layer,
// and two layers of the loop were read from disk at every step (1.12x mru).
// Extents in use of at most extent_min are shared as before: small pins are
// what they are for. The tails cost less than a page each.
//
// Note [Refused page-locks]
// A backend may refuse to page-lock memory it committed: cudaHostRegister
// fails for large ranges on WSL2 and in some containers (microsoft/WSL#14078:
// above about 500 MB in Docker on WSL2), mlock past RLIMIT_MEMLOCK. A request
// that asked for a lock is then served all the same, from the extent committed
// for it (or the prewarmed cut) left unlocked, which a later request that
// needs no lock may share. The refusal counts in lock_failures and the first
// one prints a warning (csrc/base/warn.h). A copy from unlocked memory is
// correct (the driver stages pageable memory), only slower. An adopted block
// whose lock is refused is likewise served unlocked.
//
// Note [Fences protect blocks]
// A fence recorded on a block (a copy in flight from it) keeps the block out of
// reuse: a block freed while a fence is pending is parked and only returns to the
// free lists once every fence reports done(), checked outside the lock. A fence
// stays on its block while it is queried: record_fence() and end_copy() copy the
// list, query it unlocked and then remove only the fences that reported done, so
// an unlock() in between still sees every fence.
//
// Note [Copies from a block]
// A fence can only be recorded after its copy was issued, so fences alone
// leave a window: between issuing a non_blocking copy from a block and
// recording its fence, nothing in the pool says the block is being read. An
// unlock() of another block of the same extent in that window dropped the
// whole extent's page-lock under the copy (the DMA then reads pages the driver
// no longer holds). begin_copy() closes it: the caller calls it before issuing a
// copy from a block and end_copy() (with the copy's fence, or none for a copy
// that completed) after. While a block has a copy begun and not ended:
//  - unlock() of any block of its extent refuses (returns 0), as it does for a
//    fence not yet done on any block of the extent;
//  - free() parks the block, and it returns to the free lists only once its
//    copies ended and its fences are done;
//  - in_flight() is true.
// While an unlock() is between its lock holds (its fence queries and the
// backend call run unlocked), begin_copy() on a block of that extent refuses
// (returns false, counted in copy_refusals): the caller copies from elsewhere
// (the pin's source) instead, and no copy can start on pages whose lock is
// being dropped. An idle extent has no allocated block, hence no copy: decommit
// needs no such check. A copy from an unlocked extent is safe for the pool's
// purposes: the driver stages pageable memory before the call returns.
//
// Note [Adopted blocks]
// adopt() takes memory the pool did not commit, a range another component
// mapped (pins shared across processes: a MAP_SHARED mapping of a shared
// segment), as one allocated block. So a pin of a shared segment is served as
// any other: the pool stays the one place that knows whether a copy from
// pinned memory is in flight (Note [Fences protect blocks], Note [Copies from a
// block]) and the one place that page-locks, so the registration ceiling counts
// and drops the locks of shared pins as it does those of private ones. The pool
// knows nothing of files or segments: it page-locks the range through the
// backend when asked (lock and unlock are the only backend calls it makes on
// it, Note [Host backend contract]) and, once the block is freed and no copy or
// fence holds it, it unlocks the range and calls the `release` it was given,
// once, with no lock of the pool held; the owner unmaps there.
//  - An adopted block is an extent of its own, with no segment, cut in exactly
//    one block. It never joins the free lists, the idle set, the ranges, a
//    prewarm, trim(), a decommit or the cap; it counts in adopted_bytes and
//    adopted_blocks, not in committed_bytes, idle_bytes or the allocation
//    counters (allocations, frees, allocated_bytes, requested_bytes, blocks).
//    Its page-lock counts in locked_bytes and in the lock counters: it is
//    page-locked memory of this process, which the ceiling bounds.
//  - Every per-block call takes it: free, record_fence, in_flight, begin_copy,
//    end_copy, requested_size, is_locked, and unlock(), which drops its lock
//    with an own extent's checks (refused while a copy is begun or a fence is
//    not done; begin_copy() refused while the lock is being dropped).
//  - A free() while a copy is begun, a fence is listed or an unlock() is
//    between its lock holds parks it; reap() retires it once its copies ended
//    and its fences are done, as it returns an own parked block. Retiring takes the block out of
//    blocks_ (no call finds it any more) and marks its extent retiring, unlocks
//    it with the lock released, forgets it, then calls `release`. A release
//    runs in the thread whose free(), try_allocate() or trim() (their reap)
//    retired the block; ~HostPool releases every block still adopted, freed or
//    not.
//  - fork() (Note [Fork safety] in csrc/runtime/runtime.h): the child's copy of
//    the bookkeeping lists the parent's adopted blocks, with their `release`,
//    over the same shared pages; a free there runs `release` in the child, so
//    an owner that keeps state across processes tells them apart itself. An
//    adopt() or a retire caught between its lock holds leaves its extent
//    being locked or retiring in the child: never served, never released.
//
// Locking: one mutex, mu_, level 3 of Note [Lock order]
// (csrc/base/thread_safety.h): the last lock taken, and no other lock is taken
// while it is held. Backend calls and fence queries run with it released; the
// range they work on is taken out of every free list first, so no other thread
// can see it in between (Note [Host pool invariants] names these in-between
// states: bytes being committed, extents being decommitted or unlocked, blocks a
// reap holds, adopted blocks being locked or retired).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "csrc/base/thread_safety.h"
#include "csrc/pool/backend.h"
#include "csrc/pool/fence.h"
#include "csrc/pool/options.h"
#include "csrc/pool/snapshot.h"
#include "csrc/pool/stats.h"

namespace pins {

class HostPool {
 public:
  // The pool owns its backend. Every block it hands out must be freed before
  // the pool is destroyed (its destructor returns all memory to the backend);
  // process-wide, the Runtime (csrc/runtime/runtime.h) never destroys it.
  // Throws pins::ValueError for an alignment that is not a power of two no
  // larger than the backend's page, and for a segment_size or extent_min past
  // kMaxAllocation.
  HostPool(std::unique_ptr<HostBackend> backend, PoolOptions options);

  // The largest block, segment or extent the pool works with: 2^48 bytes (the
  // user address space of x86-64). Every sum the pool forms stays below 2^64.
  static constexpr size_t kMaxAllocation = size_t{1} << 48;
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A block of at least `size` bytes, page-locked when `lock` and the backend can
  // lock (unlocked when it refuses: Note [Refused page-locks]); nullptr when the
  // cap or the OS refuses the memory (nothing changed then). A size
  // of 0 or past kMaxAllocation is a pins::ValueError (nothing changed either):
  // no size arithmetic of the pool can wrap below that bound. `budgeted`: the
  // block of a pin the balancer's budget reserved, counted in
  // CapRoom::budgeted when allocated (Note [Cap budget]).
  void* try_allocate(size_t size, bool lock = true, bool budgeted = false) PINS_EXCLUDES(mu_);
  // As try_allocate, but a refusal throws pins::ResourceError stating the
  // request, the cap and the current use.
  void* allocate(size_t size, bool lock = true) PINS_EXCLUDES(mu_);
  // Returns a block. Throws pins::ValueError for a pointer this pool did not hand out.
  void free(void* ptr) PINS_EXCLUDES(mu_);

  // Note [Adopted blocks]. Takes [data, data + size), mapped by the caller
  // (whole pages: data page-aligned, size a positive multiple of the page up to
  // kMaxAllocation), as one allocated block; returns data. Page-locked through
  // the backend when `lock` and the backend can lock; a lock the backend refuses
  // leaves it unlocked and counts in lock_failures. Once the block is freed and
  // no copy or fence holds it, the pool unlocks it (when locked) and calls
  // `release` once, with no lock of the pool held, then forgets it; ~HostPool
  // does the same for every block still adopted. `release` must not throw and,
  // from ~HostPool, must not use the pool. Throws pins::ValueError, with nothing
  // changed, for a null or unaligned data, a bad size, an empty `release`, or a
  // range that overlaps this pool's segments or another adopted block.
  void* adopt(void* data, size_t size, bool lock, std::function<void()> release) PINS_EXCLUDES(mu_);

  // Note [Fences protect blocks]
  void record_fence(void* ptr, std::shared_ptr<Fence> fence) PINS_EXCLUDES(mu_);
  // A copy begun and not ended, or a fence not done (Note [Copies from a block]).
  bool in_flight(void* ptr) PINS_EXCLUDES(mu_);

  // Note [Copies from a block]. begin_copy: true when a copy from the allocated
  // block `ptr` may be issued now (end_copy must follow); false, with nothing
  // changed, while the page-lock of its extent is being dropped. end_copy:
  // records `fence` (null: the copy is complete) and ends one begun copy; `ptr`
  // may have been freed meanwhile (it is parked until then). Both throw
  // pins::ValueError for a pointer that is not such a block.
  bool begin_copy(void* ptr) PINS_EXCLUDES(mu_);
  void end_copy(void* ptr, std::shared_ptr<Fence> fence = nullptr) PINS_EXCLUDES(mu_);

  // Commits `bytes` (rounded up to whole pages) ahead of need as a prewarmed
  // extent (Note [Host pool layout]): populated by the backend's commit() with
  // the pool's lock released, never page-locked, listed idle. Returns the bytes
  // committed; 0, with nothing changed, when the cap would be passed or the OS
  // refuses. It decommits nothing to make room and leaves the retain limit to
  // its caller (the balancer sets it first, Note [Prewarm]). A size of 0 or past
  // kMaxAllocation is a pins::ValueError.
  size_t prewarm(size_t bytes) PINS_EXCLUDES(mu_);

  // Decommits idle extents until at most `keep_idle` idle bytes remain (and
  // reaps parked blocks first). Returns the bytes decommitted.
  size_t trim(size_t keep_idle = 0) PINS_EXCLUDES(mu_);
  // The retain limit: idle bytes a free() keeps committed (the rest is
  // decommitted, oldest idle first). Starts at PoolOptions::retain_free; a
  // lower limit takes effect at the next free() or trim().
  size_t retain_free() const PINS_EXCLUDES(mu_);
  void set_retain_free(size_t bytes) PINS_EXCLUDES(mu_);
  // Committed bytes with no block allocated in them (idle extents).
  size_t idle_bytes() const PINS_EXCLUDES(mu_);
  // stats().committed_bytes.current without copying the whole stats.
  size_t committed_bytes() const PINS_EXCLUDES(mu_);

  size_t requested_size(void* ptr) const PINS_EXCLUDES(mu_);
  // Whether the block lies in a page-locked extent.
  bool is_locked(void* ptr) const PINS_EXCLUDES(mu_);
  // Drops the page-lock of the extent holding `ptr` (its memory stays committed;
  // every block in that extent becomes pageable), or of the adopted block `ptr`
  // (Note [Adopted blocks]). Returns the bytes unlocked: 0 when it was not
  // locked or a block in it has a copy in flight.
  size_t unlock(void* ptr) PINS_EXCLUDES(mu_);
  size_t cap() const PINS_EXCLUDES(mu_);
  void set_cap(size_t cap) PINS_EXCLUDES(mu_);
  // What a request of `size` (`lock` as try_allocate's) finds under the cap,
  // read under one lock hold: the balancer's budget for the cap (Note [Cap
  // budget] in csrc/balancer/budget_gate.h).
  struct CapRoom {
    size_t cap = 0;           // 0: no cap
    size_t room = 0;          // bytes it may commit, idle extents decommitted: cap + idle - committed - committing
    bool free_block = false;  // a free block of an extent in use holds it whole: it commits nothing
    uint64_t budgeted = 0;    // whole pages of the `budgeted` blocks allocated so far, as `room` shows them
  };
  CapRoom cap_room(size_t size, bool lock) const PINS_EXCLUDES(mu_);

  PoolStats stats() const PINS_EXCLUDES(mu_);
  void reset_accumulated() PINS_EXCLUDES(mu_);
  void reset_peak() PINS_EXCLUDES(mu_);
  const HostBackend& backend() const { return *backend_; }
  const PoolOptions& options() const { return opts_; }  // as built

  // Note [Fork safety] (csrc/runtime/runtime.h): the runtime's pthread_atfork
  // handlers hold mu_ across fork(), so a child never starts with it held by a
  // thread that does not exist there. Nothing else may call these.
  void lock_for_fork() PINS_ACQUIRE(mu_) { mu_.lock(); }
  void unlock_after_fork() PINS_RELEASE(mu_) { mu_.unlock(); }

  // A copy of the bookkeeping, taken under one lock hold.
  PoolSnapshot snapshot() const PINS_EXCLUDES(mu_);
  // check_snapshot(snapshot()): throws std::logic_error naming the first broken
  // invariant of Note [Host pool invariants]. For tests and debugging: it copies
  // the whole bookkeeping.
  void check_invariants() const PINS_EXCLUDES(mu_);

 private:
  struct Segment;
  struct Extent;
  struct Block;
  using FreeSet = std::set<std::pair<size_t, uintptr_t>>;  // (size, address) of free blocks
  struct Range {
    size_t size;
    Segment* seg;
  };

  // try_allocate()'s steps (pool_allocate.cpp). Those that call the backend
  // release mu_ around the call and hold it again when they return.
  void* finish(Block* b, size_t requested) PINS_REQUIRES(mu_);
  // The free block step 1 takes for a request of `asize` (Note [Idle extents
  // are not cut]), end() when none; take_free() takes it, cap_room() reads it.
  FreeSet::const_iterator find_free(size_t asize, bool locked, uintptr_t fresh = 0) const PINS_REQUIRES(mu_);
  Block* take_free(size_t asize, bool locked, uintptr_t fresh = 0) PINS_REQUIRES(mu_);
  // Locks a cut of the prewarmed extent `pre` for a request of `need` (whole
  // pages) and lists it idle: locked, or, when the backend refuses (counted),
  // unlocked. Whether it locked.
  bool lock_prewarmed(Extent* pre, size_t need) PINS_REQUIRES(mu_);
  // Room under the cap for `need` more committed bytes: there already, made by
  // decommitting idle extents (the caller looks again), or none to be made.
  enum class Room { Fits, Freed, Refused };
  Room make_room(size_t need) PINS_REQUIRES(mu_);
  // The extent a request of `need` commits now: extent_size(need), cut to whole
  // pages of what the cap leaves.
  size_t new_extent_size(size_t need) const PINS_REQUIRES(mu_);
  // Free address space for an extent of `esize` bytes, or of `need` (esize is
  // set to it) when no range holds esize.
  bool take_space(size_t need, size_t& esize, uintptr_t* addr, Segment** seg) PINS_REQUIRES(mu_);
  // Reserves a segment of at least `bytes` and lists its range free; false when
  // the backend refuses.
  bool reserve_segment(size_t bytes) PINS_REQUIRES(mu_);
  // Commits (and locks when `lock`) [addr, addr + esize), taken from seg's free
  // ranges, and lists it as an idle extent: Done; Unlocked when the backend
  // refused the lock (Note [Refused page-locks]); Refused, the range given
  // back, when it refused the commit.
  enum class Committed { Done, Unlocked, Refused };
  Committed commit_extent(uintptr_t addr, size_t esize, Segment* seg, bool lock) PINS_REQUIRES(mu_);
  // Note [Refused page-locks]: the warning, once per pool. Called unlocked.
  void warn_refused_lock(size_t bytes, int err) PINS_EXCLUDES(mu_);
  void release(Block* b) PINS_REQUIRES(mu_);
  std::vector<Extent*> pick_idle(size_t over) PINS_REQUIRES(mu_);
  // The extent a request of `need` (whole pages) commits: extent_min when it
  // is at most half that, else `need`.
  size_t extent_size(size_t need) const { return 2 * need <= shared_extent() ? shared_extent() : need; }
  // The extent small requests share: extent_min in whole pages.
  size_t shared_extent() const { return round_page(opts_.extent_min); }
  // Lists `e` (no block yet) as an idle extent of one free block.
  void list_idle(Extent* e) PINS_REQUIRES(mu_);
  // Note [Host pool layout]: takes the first `esize` bytes (whole pages) of the
  // listed prewarmed extent `e` out of every list, as an extent of their own
  // with no block, no longer prewarmed (returned: `e` itself); the rest stays a
  // listed prewarmed extent. take_prewarmed() counts it served to a request.
  Extent* split_prewarmed(Extent* e, size_t esize) PINS_REQUIRES(mu_);
  Extent* take_prewarmed(Extent* e, size_t esize) PINS_REQUIRES(mu_);
  // The smallest prewarmed extent of at least `bytes`; nullptr when none.
  Extent* find_prewarmed(size_t bytes) const PINS_REQUIRES(mu_);
  // Where prewarm() commits `esize` bytes: right after the last prewarmed
  // extent when its segment is free there, else the best fit.
  bool take_prewarm_space(size_t esize, uintptr_t* addr, Segment** seg) PINS_REQUIRES(mu_);
  // Joins the listed prewarmed extent `e` with prewarmed neighbours of its
  // segment; returns the extent that holds it now.
  Extent* join_prewarmed(Extent* e) PINS_REQUIRES(mu_);
  // `a` takes its neighbour `b`: both listed idle, unlocked, in one segment.
  void join_extents(Extent* a, Extent* b) PINS_REQUIRES(mu_);
  void decommit(std::vector<Extent*> victims) PINS_EXCLUDES(mu_);
  void add_range(uintptr_t addr, size_t size, Segment* seg) PINS_REQUIRES(mu_);
  bool take_range(size_t size, uintptr_t* addr, Segment** seg) PINS_REQUIRES(mu_);
  void move_free_blocks(Extent* e, bool from_locked, bool to_locked) PINS_REQUIRES(mu_);
  void reap() PINS_EXCLUDES(mu_);
  // Note [Adopted blocks]: whether [addr, addr + size) overlaps a segment or an
  // adopted block; what it overlaps, or nullptr.
  const char* overlap(uintptr_t addr, size_t size) const PINS_REQUIRES(mu_);
  // Lists the adopted extent `e` (no block yet) as its one allocated block.
  void list_adopted(Extent* e) PINS_REQUIRES(mu_);
  // Takes the freed adopted block `b` (no copy begun, no fence, its extent not
  // being unlocked) out of blocks_, marks its extent retiring and appends the
  // extent to `retired`, for release_adopted().
  void retire(Block* b, std::vector<Extent*>& retired) PINS_REQUIRES(mu_);
  // Unlocks the retiring extents, forgets them, then calls their `release`.
  void release_adopted(std::vector<Extent*> retired) PINS_EXCLUDES(mu_);
  // Appends `fence` to the block, dropping those of its fences that are done
  // (queried unlocked); with `ends_copy`, also ends one begun copy.
  void add_fence(void* ptr, std::shared_ptr<Fence> fence, bool ends_copy, const char* what) PINS_EXCLUDES(mu_);
  Block* find(void* ptr, const char* what) const PINS_REQUIRES(mu_);
  // An allocated or parked block with a copy begun (end_copy's argument).
  Block* find_copying(void* ptr, const char* what) const PINS_REQUIRES(mu_);
  size_t round_align(size_t n) const { return (n + align_ - 1) & ~(align_ - 1); }
  size_t round_page(size_t n) const { return (n + page_ - 1) & ~(page_ - 1); }

  const std::unique_ptr<HostBackend> backend_;
  const PoolOptions opts_;
  const size_t page_;
  const size_t align_;
  const bool can_lock_;

  // The Segment, Extent and Block records are reached only through these
  // guarded containers, so they are guarded by mu_ as well; the one exception is
  // an extent picked for decommit, which is in no container but extents_ and is
  // touched only by the decommit() that picked it until it relocks, and so is a
  // retiring adopted extent (in adopted_ only) by release_adopted().
  mutable Mutex mu_;
  size_t cap_ PINS_GUARDED_BY(mu_);
  size_t committing_ PINS_GUARDED_BY(mu_) = 0;  // bytes taken from ranges_, commit in flight
  size_t reaping_ PINS_GUARDED_BY(mu_) = 0;     // parked blocks a reap() holds outside parked_
  size_t idle_bytes_ PINS_GUARDED_BY(mu_) = 0;
  uint64_t budgeted_ PINS_GUARDED_BY(mu_) = 0;  // CapRoom::budgeted
  size_t retain_free_ PINS_GUARDED_BY(mu_);  // the retain limit (set_retain_free)
  uintptr_t prewarm_end_ PINS_GUARDED_BY(mu_) = 0;  // where the last prewarm() ended: the next continues there
  uint64_t clock_ PINS_GUARDED_BY(mu_) = 0;
  std::map<uintptr_t, std::unique_ptr<Segment>> segments_ PINS_GUARDED_BY(mu_);
  std::map<uintptr_t, Range> ranges_ PINS_GUARDED_BY(mu_);  // uncommitted free address space
  std::set<std::pair<size_t, uintptr_t>> ranges_by_size_ PINS_GUARDED_BY(mu_);
  std::map<uintptr_t, std::unique_ptr<Extent>> extents_ PINS_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, Extent*>> idle_ PINS_GUARDED_BY(mu_);  // by idle age
  std::unordered_map<uintptr_t, std::unique_ptr<Block>> blocks_ PINS_GUARDED_BY(mu_);  // every block, by address
  FreeSet free_[2] PINS_GUARDED_BY(mu_);  // free blocks by size; [locked]
  std::vector<Block*> parked_ PINS_GUARDED_BY(mu_);
  std::map<uintptr_t, std::unique_ptr<Extent>> adopted_ PINS_GUARDED_BY(mu_);  // Note [Adopted blocks]
  PoolStats stats_ PINS_GUARDED_BY(mu_);
  std::atomic<bool> warned_lock_{false};  // Note [Refused page-locks]
};

}  // namespace pins
