// The balancer: keeps the pins of every registered model, creates them on the
// cast path within the RAM budget, and evicts along the priority tiers. It ties
// together the registry (registry.h), the budget formulas (budget.h), the
// eviction order (eviction.h, Note [Pin eviction tiers]) and the trace recorder
// (trace.h, Note [Trace policy]).
//
// Note [Balancer locking]
// One mutex, mu_, guards the registry, the trace recorder and the counters. It
// is level 2 of Note [Lock order] (csrc/base/thread_safety.h): mu_ may be held
// while taking HostPool's mutex for non-blocking queries (is_locked, stats);
// never the reverse. No pool allocation or free, no fence query, no /proc read
// happens under mu_: victims are chosen and marked Evicting under mu_, checked
// for copies in flight and freed outside it, and unlinked under mu_ again.
// Across fork() the runtime's handlers hold mu_ (lock_for_fork, Note [Fork
// safety] in csrc/runtime/runtime.h).
//
// Note [Budget reservation]
// The budget check works on a reading of system memory taken unlocked, and a
// new pin's memory shows only once the pool allocated its block (committed
// pages are populated; a reused idle extent leaves the pool's idle count).
// Two casts on the same reading could each see room for one pin and both
// allocate. So a pin being made reserves its bytes, under mu_, when the budget
// admits it, until its block is allocated (or refused): the check subtracts
// from the available figure every reservation held, and the bytes of
// reservations settled (blocks allocated) since the cast's reading was taken,
// which that reading may not show. The check after freeing is made again
// under mu_ against the reservations of that moment. So the pins admitted on
// one reading never take more than it said was available; a reading is at
// worst conservative.
//
// Note [Dead source reclaim]
// A pin whose source died (SourceGuard::alive() false) serves nothing, but its
// memory stays pinned until someone looks. Every linked pin has a slot in a
// ring; each acquire() and relieve() checks the next kReclaimPerCall pins of
// the ring (a cursor, wrapping) and drops those whose source died, freeing
// them outside mu_: bounded work per call, and no boundary needed. The slots
// not yet checked this round stay contiguous after the cursor (a removal keeps
// them so, new pins join at the end), so no pin is passed over: one whose
// source died is dropped within about pins / (kReclaimPerCall - 1) later
// calls. Each eviction decision checks kReclaimPerDecision slots, each prompt or
// node boundary kReclaimPerBoundary; sweep() checks every pin (the free_pins
// op: an explicit request for RAM).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "csrc/balancer/eviction.h"
#include "csrc/balancer/registry.h"
#include "csrc/balancer/source_index.h"
#include "csrc/balancer/stats.h"
#include "csrc/balancer/trace.h"
#include "csrc/base/thread_safety.h"
#include "csrc/pool/pool.h"
#include "csrc/config/config.h"
#include "csrc/system/sysmem.h"

namespace pins {

class Balancer;

// A cast's hold on a pin: the pin is neither evicted nor reused while the lease
// lives. An empty lease means "no pin": copy straight from the source. The
// Balancer that issued a lease must outlive it.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& o) noexcept { *this = std::move(o); }
  Lease& operator=(Lease&& o) noexcept;
  ~Lease();
  explicit operator bool() const { return pin_ != nullptr; }
  void* data() const;
  size_t bytes() const;
  Subset subset() const;
  bool hit() const { return hit_; }
  // The pin was just created: the caller must write the source into data() and
  // then call filled(). A lease dropped before filled() drops the pin.
  bool needs_fill() const { return fill_; }
  void filled();

 private:
  // Note [Copies from a block] (csrc/pool/pool.h): a lease is a copy from its
  // pin's block announced to the pool (begin_copy when handed out); its release
  // ends it (end_copy), after the op recorded its fence. So the extent keeps its
  // page-lock and the block is not reused between the copy's issue and its fence.
  friend class Balancer;
  Balancer* owner_ = nullptr;
  Pin* pin_ = nullptr;
  bool hit_ = false;
  bool fill_ = false;
};

// One cast's request for a pin (Note [Pin validity] in registry.h says what must
// match for a pin to serve it).
struct Request {
  ModelId model = -1;
  PinKey key;                          // the source's, or a gathered pin's own
  size_t bytes = 0;                    // the pin's size; 0: nothing to pin (Bypass::Empty)
  Kind kind = Kind::Weights;
  bool resident = false;               // the copy stays on the device
  std::optional<int64_t> signature;    // patch set (patches) or content signature (weights)
  std::optional<uint64_t> version;     // the source's version counter now; none without one
  uint64_t span = 0;                   // bytes of its storage the source reaches (0: key.nbytes)
  std::vector<SourcePart> parts;       // a gathered pin: every source in order; empty for one
  const char* op = "cast_to_device";   // names the caller in the error for a model not registered
};

class Balancer {
 public:
  // `pool` and `probe` must outlive the balancer (its destructor frees its
  // pins' blocks into `pool`).
  Balancer(const Config& config, HostPool& pool, MemoryProbe& probe);
  ~Balancer();
  Balancer(const Balancer&) = delete;
  Balancer& operator=(const Balancer&) = delete;

  // Policy, fast-disk and budget constants; pool settings stay as built.
  void configure(const Config& config) PINS_EXCLUDES(mu_);
  Config config() const PINS_EXCLUDES(mu_);

  // ---- models
  ModelId register_model(std::string name, std::string load_device, ModelOptions options = {}) PINS_EXCLUDES(mu_);
  void forget_model(ModelId model) PINS_EXCLUDES(mu_);  // frees all its pins
  // Active: executing now. Becoming active counts as being loaded again (moves
  // the model to the front of the load order).
  void set_active(ModelId model, bool active) PINS_EXCLUDES(mu_);
  bool has_model(ModelId model) const PINS_EXCLUDES(mu_);

  // ---- prompts
  void mark_prompt(const std::vector<ModelId>& models) PINS_EXCLUDES(mu_);  // starts a prompt if none
  void end_prompt() PINS_EXCLUDES(mu_);  // the boundary: clears marks, drops `patches`, rolls the trace
  // A node boundary inside the prompt: drops the `patches` pins and clears
  // `active` on every model; the prompt, its marks and the trace go on.
  void end_node() PINS_EXCLUDES(mu_);
  bool prompt_running() const PINS_EXCLUDES(mu_);

  // ---- the cast path (DESIGN.md "Choosing and creating a pin")
  // `make_guard` is called only when a pin is created. An empty lease means
  // "copy from the source", counted under its Bypass reason.
  Lease acquire(const Request& r, const std::function<std::unique_ptr<SourceGuard>()>& make_guard = {})
      PINS_EXCLUDES(mu_);
  // Counts a cast without a model (a plain copy by request). Lock-free.
  void count_plain_copy() { plain_copies_.fetch_add(1, std::memory_order_relaxed); }

  // ---- staleness the version counter cannot see (Note [Pin validity])
  // Drops every pin, of any model and subset, with a source whose bytes overlap
  // [offset, offset + span) of `storage` (Note [Source index]); returns their
  // bytes. A leased pin, or one being evicted, is detached: never served again,
  // freed when its holder lets go.
  size_t invalidate(uint64_t storage, uint64_t offset, uint64_t span) PINS_EXCLUDES(mu_);
  // Drops every pin of `model` (which stays registered); returns their bytes.
  size_t invalidate_model(ModelId model) PINS_EXCLUDES(mu_);

  // ---- budget (DESIGN.md "Budget", budget.h)
  // Frees at least `bytes`: pins of dead sources the next kReclaimPerDecision
  // slots of the ring hold first, then along tiers 1-4 (and 5 when
  // evict_active); returns the bytes of pins freed. Short of pins, it
  // decommits the pool's idle extents too, up to the rest of `bytes`.
  size_t free(size_t bytes, bool evict_active = false) PINS_EXCLUDES(mu_);
  // The RAM-pressure check: frees (headroom - available) + relieve_slack when positive.
  size_t relieve() PINS_EXCLUDES(mu_);
  // Drops pins whose source died, checking every pin (O(pins)); returns their bytes.
  size_t sweep() PINS_EXCLUDES(mu_);
  // Note [Dead source reclaim]: checks the next `checks` slots of the ring (each
  // pin at most once) and drops the pins whose source died; returns their bytes.
  size_t reclaim(size_t checks) PINS_EXCLUDES(mu_);

  // Note [Dead source reclaim]: ring slots checked per acquire() and relieve(),
  // per eviction decision, and per prompt or node boundary (the pins::end_prompt
  // and pins::end_node ops). Constants: no call's work grows with the pins.
  static constexpr size_t kReclaimPerCall = 8;
  static constexpr size_t kReclaimPerDecision = 8;
  static constexpr size_t kReclaimPerBoundary = 256;

  // The simulator's clairvoyant reuse policy (ReuseHistory::set_future).
  void set_reuse_future(ReuseHistory::Future future) PINS_EXCLUDES(mu_) {
    MutexLock g(mu_);
    reuse_.set_future(std::move(future));
  }

  // ---- stats
  // COUNT and SUM totals never decrease: a forgotten model's counters stay in
  // the totals (retired_); levels drop.
  BalancerStats stats() const PINS_EXCLUDES(mu_);
  SubsetStats subset_stats(ModelId model, Subset s) const PINS_EXCLUDES(mu_);
  struct PinInfo {
    ModelId model;
    Subset subset;
    PinKey key;
    size_t bytes;
    bool locked;
  };
  std::vector<PinInfo> pins() const PINS_EXCLUDES(mu_);  // every live pin, for tests and tools
  // Note [Trace index]: pins the by_trace indexes list at another rank than
  // the recorder's now, or miss, while they are kept current (none otherwise);
  // for tests. O(pins).
  std::optional<size_t> trace_index_faults() const PINS_EXCLUDES(mu_);
  // Bytes reserved by pins being made (Note [Budget reservation]).
  uint64_t reserved_bytes() const PINS_EXCLUDES(mu_);

  // Note [Fork safety] (csrc/runtime/runtime.h): the runtime's pthread_atfork
  // handlers hold mu_ across fork(), between the runtime's lock and the pool's
  // (Note [Lock order]), and probe_mu_ (a leaf) after mu_. Nothing else may call these.
  void lock_for_fork() PINS_ACQUIRE(mu_, probe_mu_) {
    mu_.lock();
    probe_mu_.lock();
  }
  void unlock_after_fork() PINS_RELEASE(mu_, probe_mu_) {
    probe_mu_.unlock();
    mu_.unlock();
  }

 private:
  friend class Lease;

  void release(Pin* pin) PINS_EXCLUDES(mu_);
  void mark_filled(Pin* pin) PINS_EXCLUDES(mu_);
  Model& model_locked(ModelId id, const char* what) PINS_REQUIRES(mu_);
  const Model& model_locked(ModelId id, const char* what) const PINS_REQUIRES(mu_);
  Pin* find_locked(Model& m, Subset s, const Request& r, std::vector<void*>& to_free) PINS_REQUIRES(mu_);
  void unlink_locked(Pin* p, std::vector<void*>& to_free) PINS_REQUIRES(mu_);
  // The eviction order of `reach`, walked until `visit` returns false (Note [Eviction walk]).
  void walk_locked(Reach reach, const std::function<bool(const Candidate&)>& visit) PINS_REQUIRES(mu_);
  // Note [Trace index]: whether the models' by_trace indexes hold every pin at
  // its rank now; the pins of `keys` ranked again; every pin ranked again (at
  // the first decision of a generation); the indexes emptied (another policy).
  bool trace_index_current_locked() const PINS_REQUIRES(mu_);
  void retrace_locked(const std::vector<TraceKey>& keys) PINS_REQUIRES(mu_);
  void rebuild_trace_index_locked() PINS_REQUIRES(mu_);
  void clear_trace_index_locked() PINS_REQUIRES(mu_);
  // Note [Reuse policy]: p into its model's by_reuse (after a use), out of it;
  // every pin in or out (a change of policy).
  void reuse_index_locked(Model& m, Pin* p) PINS_REQUIRES(mu_);
  void reuse_unindex_locked(Model& m, Pin* p) PINS_REQUIRES(mu_);
  void set_reuse_indexes_locked(bool on) PINS_REQUIRES(mu_);
  // Ends with keep_warm(warm_line) (Note [Warm idle memory]).
  size_t free_along_tiers(size_t bytes, Reach reach, uint64_t warm_line) PINS_EXCLUDES(mu_);
  // Makes room for a new pin of `bytes` in `target`: true when it may be created.
  // Note [Budget reservation]: when true, `bytes` are reserved; `settled_at_read`
  // is settled_ before `mi` was read.
  bool ensure_budget(size_t bytes, Subset target, MemoryInfo& mi, uint64_t settled_at_read)
      PINS_EXCLUDES(mu_);  // may read mi afresh
  // Reserves `bytes` when the budget admits them on `available` (less the
  // reservations that reading does not show); returns the shortfall, 0 when reserved.
  uint64_t reserve(size_t bytes, uint64_t available, uint64_t settled_at_read, const Config& c) PINS_EXCLUDES(mu_);
  // Registration ceiling: whether a new pin of `bytes` may be page-locked,
  // after dropping page-locks along the tiers if needed.
  bool ensure_lock_room(size_t bytes, const MemoryInfo& mi) PINS_EXCLUDES(mu_);
  void free_blocks(const std::vector<void*>& blocks) PINS_EXCLUDES(mu_);  // into the pool, outside mu_
  // Note [Memory readings]: the probe's reading, reused for max_age_ns and
  // adjusted by the pool's commits since; `fresh` reads now.
  MemoryInfo memory(bool fresh = false) PINS_EXCLUDES(mu_, probe_mu_);
  // Note [Warm idle memory]: sets the pool's retain limit from the budget and
  // decommits the idle bytes past it.
  void keep_warm(const MemoryInfo& mi, uint64_t line) PINS_EXCLUDES(mu_, probe_mu_);
  // `available` less the reservations a reading taken at `settled_at_read`
  // (settled_ then) does not show (Note [Budget reservation]).
  uint64_t unreserved_locked(uint64_t available, uint64_t settled_at_read) const PINS_REQUIRES(mu_);
  // Note [Dead source reclaim]: the ring, and one bounded step over it.
  void ring_add_locked(Pin* p) PINS_REQUIRES(mu_);
  void ring_remove_locked(Pin* p) PINS_REQUIRES(mu_);
  size_t reclaim_step_locked(std::vector<void*>& to_free, size_t checks) PINS_REQUIRES(mu_);  // bytes dropped
  SubsetStats& stats_locked(const Pin& p) PINS_REQUIRES(mu_);  // its model's counters for its subset
  void reap_orphan_locked(Pin* p, std::vector<void*>& to_free) PINS_REQUIRES(mu_);  // frees a detached pin
  // Counts a cast served from the source (the model may be gone).
  void bypass_locked(ModelId model, Bypass why) PINS_REQUIRES(mu_);
  // Drops (counted as `dropped`, and `invalidated` when asked) the pins of m's
  // subset s that match; returns their bytes.
  size_t drop_if_locked(Model& m, Subset s, const std::function<bool(const Pin&)>& pred,
                        std::vector<void*>& to_free, bool invalidated = false) PINS_REQUIRES(mu_);
  // Links a new pin into its model's subset and the source index.
  void link_locked(Model& m, std::unique_ptr<Pin> pin) PINS_REQUIRES(mu_);

  HostPool& pool_;     // must outlive the balancer
  MemoryProbe& probe_;  // must outlive the balancer

  // Note [Memory readings]: the last reading, when, and the pool's committed
  // bytes then. A leaf lock: no other lock is taken while it is held (the
  // probe is read and the pool asked with it released).
  mutable Mutex probe_mu_;
  MemoryInfo reading_ PINS_GUARDED_BY(probe_mu_);
  int64_t reading_ns_ PINS_GUARDED_BY(probe_mu_) = 0;  // 0: none yet
  size_t reading_committed_ PINS_GUARDED_BY(probe_mu_) = 0;

  mutable Mutex mu_;
  Config config_ PINS_GUARDED_BY(mu_);
  Models models_ PINS_GUARDED_BY(mu_);
  SourceIndex sources_ PINS_GUARDED_BY(mu_);  // every linked pin by source storage (Note [Source index])
  std::unordered_map<Pin*, std::unique_ptr<Pin>> orphans_ PINS_GUARDED_BY(mu_);  // detached pins with leases out
  ModelId next_model_ PINS_GUARDED_BY(mu_) = 0;
  uint64_t seq_ PINS_GUARDED_BY(mu_) = 0;    // load order and pin creation order
  uint64_t clock_ PINS_GUARDED_BY(mu_) = 0;  // accesses
  bool prompt_ PINS_GUARDED_BY(mu_) = false;
  TraceRecorder trace_ PINS_GUARDED_BY(mu_);  // recorded under the trace policy only
  ReuseHistory reuse_ PINS_GUARDED_BY(mu_);   // recorded under the reuse policy only (Note [Reuse policy])
  bool reuse_on_ PINS_GUARDED_BY(mu_) = false;  // the models' by_reuse indexes are kept
  // Note [Trace index]: the trace_ generation the by_trace indexes were ranked
  // at (kNoTraceIndex: none), and the keys an access re-ranks (kept for its capacity).
  static constexpr uint64_t kNoTraceIndex = ~uint64_t{0};
  uint64_t trace_generation_ PINS_GUARDED_BY(mu_) = kNoTraceIndex;
  std::vector<TraceKey> trace_moved_ PINS_GUARDED_BY(mu_);
  // Global counters (BalancerStats).
  int64_t refusals_ PINS_GUARDED_BY(mu_) = 0;        // COUNT
  int64_t pressure_freed_ PINS_GUARDED_BY(mu_) = 0;  // SUM bytes freed by relieve()
  int64_t relieve_calls_ PINS_GUARDED_BY(mu_) = 0;   // COUNT
  int64_t busy_misses_ PINS_GUARDED_BY(mu_) = 0;     // COUNT hits on a pin still filling
  int64_t bypassed_[kBypassReasons] PINS_GUARDED_BY(mu_) = {};  // COUNT by reason, forgotten models included
  SubsetStats retired_[kSubsets] PINS_GUARDED_BY(mu_);  // COUNTs and SUMs of forgotten models (levels 0)
  // Note [Budget reservation].
  uint64_t reserved_ PINS_GUARDED_BY(mu_) = 0;  // level: bytes of pins being made
  uint64_t settled_ PINS_GUARDED_BY(mu_) = 0;   // SUM: bytes of reservations ended by an allocation
  // Note [Dead source reclaim]: every linked pin; slots [ring_next_, end) are not checked yet this round.
  std::vector<Pin*> ring_ PINS_GUARDED_BY(mu_);
  size_t ring_next_ PINS_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> plain_copies_{0};              // COUNT casts without a model
};

}  // namespace pins
