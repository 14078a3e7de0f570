// The balancer: keeps the pins of every registered model, creates them on the
// cast path within the RAM budget, and evicts along the priority tiers. It
// composes three parts and owns the lock over them:
//   - the pin table (pin_table.h): models, pins, subsets, the indexes of the
//     eviction order (eviction.h, Note [Pin eviction tiers]), the policies'
//     records (trace.h, reuse.h), reclaim of dead sources, the cast counters;
//   - the budget gate (budget_gate.h): memory readings, reservations of pins
//     being made, idle memory kept warm, by the formulas of budget.h;
//   - the host pool (csrc/pool/pool.h) the pins' blocks come from.
// Its own files: balancer.cpp (models, prompts, invalidation, stats),
// acquire.cpp (the cast path: lookup, admit, create), freeing.cpp (freeing
// along the tiers, the RAM-pressure check, the registration ceiling).
//
// Note [Balancer locking]
// One mutex, mu_, guards the pin table and the configuration. It is level 2
// of Note [Lock order] (csrc/base/thread_safety.h): mu_ may be held while
// taking HostPool's mutex for non-blocking queries (is_locked, begin_copy,
// stats) and the budget gate's leaf lock; never the reverse. No pool
// allocation or free, no fence query, no /proc read happens under mu_: victims
// are chosen and marked Evicting under mu_, checked for copies in flight and
// freed outside it, and unlinked under mu_ again. Across fork() the runtime's
// handlers hold mu_ (lock_for_fork, Note [Fork safety] in csrc/runtime/runtime.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "csrc/balancer/budget_gate.h"
#include "csrc/balancer/eviction.h"
#include "csrc/balancer/pin_table.h"
#include "csrc/balancer/reclaim_ring.h"
#include "csrc/balancer/registry.h"
#include "csrc/balancer/stats.h"
#include "csrc/base/thread_safety.h"
#include "csrc/config/config.h"
#include "csrc/pool/pool.h"
#include "csrc/share/host_share.h"
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
  // What its pin's guard finds (SourceGuard::current; `content`: Note
  // [Content check]): may make a syscall.
  SourceChange change(bool content) const {
    return pin_->guard == nullptr ? SourceChange::None : pin_->guard->current(content);
  }
  // The pin was just created: the caller must write the source into data() and
  // then call filled(). A lease dropped before filled() drops the pin.
  bool needs_fill() const { return fill_; }
  // Note [Shared pins]: the fill goes to a shared segment, keyed by the file:
  // it must read the file (files::fill_from_file with file_only), never the
  // source's memory.
  bool shared_fill() const { return fill_ && pin_->share_publish; }
  // `publish`: a shared fill holds its key's bytes (false: the file changed
  // during it; its segment is withdrawn, never published, Note [Shared pins]).
  void filled(bool publish = true);

 private:
  // Note [Copies from a block] (csrc/pool/pool.h): a lease is a copy from its
  // pin's block announced to the pool (begin_copy when handed out); its release
  // ends it (end_copy), after the op recorded its fence. So the extent keeps its
  // page-lock and the block is not reused between the copy's issue and its fence.
  friend class Balancer;
  Lease(Balancer* owner, Pin* pin, bool hit, bool fill) : owner_(owner), pin_(pin), hit_(hit), fill_(fill) {}
  Balancer* owner_ = nullptr;
  Pin* pin_ = nullptr;
  bool hit_ = false;
  bool fill_ = false;
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
  // Note [Shared pins]: new pins of file-backed sources go through `share`
  // (null: none shared). Set once, before the first cast.
  void set_share(std::shared_ptr<share::HostShare> share) { share_ = std::move(share); }
  Config config() const PINS_EXCLUDES(mu_);

  // ---- models
  ModelId register_model(std::string name, std::string load_device, ModelOptions options = {}) PINS_EXCLUDES(mu_);
  void forget_model(ModelId model) PINS_EXCLUDES(mu_);  // frees all its pins
  // Active: executing now. Becoming active counts as being loaded again (moves
  // the model to the front of the load order).
  void set_active(ModelId model, bool active) PINS_EXCLUDES(mu_);
  // Note [Spared layers on the device] (pin_table.h): `bytes` of the model's
  // `total` bytes of weights are on its device now (more than total counts as
  // total).
  void set_device_bytes(ModelId model, uint64_t bytes, uint64_t total) PINS_EXCLUDES(mu_);
  bool has_model(ModelId model) const PINS_EXCLUDES(mu_);

  // ---- prompts
  void mark_prompt(const std::vector<ModelId>& models) PINS_EXCLUDES(mu_);  // starts a prompt if none
  void end_prompt() PINS_EXCLUDES(mu_);  // the boundary: clears marks, drops `patches`, rolls the trace
  // A node boundary inside the prompt: drops the `patches` pins and clears
  // `active` on every model; the prompt, its marks and the trace go on.
  void end_node() PINS_EXCLUDES(mu_);
  bool prompt_running() const PINS_EXCLUDES(mu_);

  // ---- the cast path (DESIGN.md "Choosing and creating a pin"; acquire.cpp)
  // `make_guard` is called only when a pin is created, with whether the
  // content_check key is on (the guard then samples the source: Note [Content
  // check]). An empty lease means "copy from the source", counted under its
  // Bypass reason.
  using MakeGuard = std::function<std::unique_ptr<SourceGuard>(bool content)>;
  Lease acquire(const Request& r, const MakeGuard& make_guard = {}) PINS_EXCLUDES(mu_);
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

  // ---- budget (DESIGN.md "Budget", budget.h; freeing.cpp)
  // Frees at least `bytes`: pins of dead sources the next kReclaimPerDecision
  // slots of the ring hold first, then along tiers 1-4 (and 5 when
  // evict_active; only 1-3 when `loaded`: what a new cache pin may take, so
  // the prompt's streaming pins stay whatever evict_active says); returns the
  // bytes of pins freed. Short of pins, it decommits the pool's idle extents
  // too, up to the rest of `bytes`.
  size_t free(size_t bytes, bool evict_active = false, bool loaded = false) PINS_EXCLUDES(mu_);
  // The RAM-pressure check: frees (headroom - available) + relieve_slack when positive.
  size_t relieve() PINS_EXCLUDES(mu_);
  // Note [Pressure from others] (budget.h): the available RAM under which the
  // pressure monitor relieves. Takes no balancer lock (the pool's, a leaf, to
  // read its committed bytes), so the monitor's thread holds none to ask.
  uint64_t pressure_line() const PINS_EXCLUDES(mu_);
  // Drops pins whose source died, checking every pin (O(pins)); returns their bytes.
  size_t sweep() PINS_EXCLUDES(mu_);
  // Note [Dead source reclaim]: checks the next `checks` slots of the ring (each
  // pin at most once) and drops the pins whose source died; returns their bytes.
  size_t reclaim(size_t checks) PINS_EXCLUDES(mu_);

  // Note [Dead source reclaim] (reclaim_ring.h): ring slots checked per
  // acquire() and relieve(), per eviction decision, and per prompt or node boundary.
  static constexpr size_t kReclaimPerCall = ReclaimRing::kPerCall;
  static constexpr size_t kReclaimPerDecision = ReclaimRing::kPerDecision;
  static constexpr size_t kReclaimPerBoundary = ReclaimRing::kPerBoundary;

  // The simulator's clairvoyant reuse policy (ReuseHistory::set_future).
  void set_reuse_future(ReuseHistory::Future future) PINS_EXCLUDES(mu_);

  // ---- stats
  // COUNT and SUM totals never decrease: a forgotten model's counters stay in
  // the totals; levels drop.
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
  uint64_t reserved_bytes() const { return gate_.reserved_bytes(); }

  // ---- Note [Prewarm] (prewarm.h; prewarm.cpp)
  // What the models in the prompt (or active) are expected to pin beyond what
  // they hold: each one's expectation less its pins' bytes, summed.
  uint64_t prewarm_want() const PINS_EXCLUDES(mu_);
  // One step of the prewarm: commits up to `max_bytes` of pool memory ahead of
  // need, no more than prewarm_want() less the pool's idle bytes and the bytes
  // of pins being made, and no more than the budget leaves (prewarm_room in
  // budget.h); returns the bytes
  // committed, 0 when nothing more is wanted or fits now (or `prewarm` is off).
  size_t prewarm_step(size_t max_bytes) PINS_EXCLUDES(mu_);

  // Note [Fork safety] (csrc/runtime/runtime.h): the runtime's pthread_atfork
  // handlers hold mu_ across fork(), between the runtime's lock and the pool's
  // (Note [Lock order]), and the budget gate's leaf lock after mu_. Nothing
  // else may call these.
  void lock_for_fork() PINS_ACQUIRE(mu_, gate_.fork_lock()) {
    mu_.lock();
    gate_.lock_for_fork();
  }
  void unlock_after_fork() PINS_RELEASE(mu_, gate_.fork_lock()) {
    gate_.unlock_after_fork();
    mu_.unlock();
  }

 private:
  friend class Lease;

  // ---- the cast path's steps (acquire.cpp)
  // What lookup() found: a lease to hand out (`served`: a hit, or none for a
  // pin busy elsewhere), else the subset a new pin goes to and what admitting
  // it needs.
  struct Lookup {
    Lease lease;
    bool served = false;
    Subset target = Subset::Weights;
    uint64_t settled_at_read = 0;  // Note [Budget reservation]: before admit()'s reading
    uint64_t reuse_gap = 0;        // Note [Reuse policy]: the key's prompt gap, for its pin
    bool content_check = false;    // the content_check key when looked up (Note [Content check])
  };
  // Records the access (unless `again`) and looks the source up (the streaming
  // subset, then an existing -loaded pin), dropping stale pins into `stale`.
  Lookup lookup(const Request& r, std::vector<void*>& stale, bool again = false) PINS_EXCLUDES(mu_);
  // A hit whose pin is not current (SourceGuard::current, looked at outside
  // mu_, found `change`): the hit is taken back, the pin dropped (the lease,
  // released here, frees it; a Content change counted), and the source looked
  // up again, a miss unless another thread pinned it meanwhile.
  Lookup look_again(const Request& r, Lookup stale_hit, SourceChange change, std::vector<void*>& stale)
      PINS_EXCLUDES(mu_);
  // Makes room for a new pin of `r` in `target` within the budget and the
  // registration ceiling and allocates its block; nullptr (the bypass counted)
  // when the budget or the pool refuses.
  struct Admitted {
    void* block = nullptr;
    share::Grant grant;  // Note [Shared pins]: the block maps this grant's segment
  };
  Admitted admit(const Request& r, Subset target, uint64_t settled_at_read) PINS_EXCLUDES(mu_);
  // Note [Shared pins]: the shared pin of r's source, when sharing is on and
  // the source may be shared; Kind::None otherwise.
  share::Grant share_grant(const Request& r);
  // The pool block over a grant's mapping, released into the share.
  void* adopt(const share::Grant& g, bool lock);
  // Links a new pin over `block` and leases it for its fill; an empty lease
  // (the block freed, the bypass counted) when the model was forgotten, the
  // source pinned by another thread meanwhile, or the block's extent is
  // losing its page-lock.
  Lease create(const Request& r, Subset target, uint64_t reuse_gap, const Admitted& admitted,
               std::unique_ptr<SourceGuard> guard) PINS_EXCLUDES(mu_);
  void release(Pin* pin) PINS_EXCLUDES(mu_);
  void mark_filled(Pin* pin, bool publish) PINS_EXCLUDES(mu_);

  // ---- freeing (freeing.cpp)
  // Frees along the tiers of `reach`, in the order PinTable::walk gives for
  // `asker`; ends with keep_warm(warm_line) (Note [Warm idle memory]).
  size_t free_along_tiers(size_t bytes, Reach reach, uint64_t warm_line, const Asker& asker = {}) PINS_EXCLUDES(mu_);
  // Makes room for a new pin of `bytes` for `asker` (its model and target
  // subset): true when it may be created.
  // Note [Budget reservation]: when true, `bytes` are reserved; `settled_at_read`
  // is the gate's settled() before `mi` was read. Note [Cap budget]: `in_pool`
  // when the pool commits its block (not a shared segment's, Note [Shared pins]).
  bool ensure_budget(size_t bytes, const Asker& asker, MemoryInfo& mi, uint64_t settled_at_read, bool in_pool)
      PINS_EXCLUDES(mu_);  // may read mi afresh
  // Registration ceiling: whether a new pin of `bytes` may be page-locked,
  // after dropping page-locks along the tiers if needed.
  bool ensure_lock_room(size_t bytes, const MemoryInfo& mi) PINS_EXCLUDES(mu_);
  // relieve() but for what it records for pressure_line().
  size_t relieve_to_headroom() PINS_EXCLUDES(mu_);
  void free_blocks(const std::vector<void*>& blocks) PINS_EXCLUDES(mu_);  // into the pool, outside mu_
  uint64_t prewarm_want_locked() const PINS_REQUIRES(mu_);

  HostPool& pool_;   // must outlive the balancer
  std::shared_ptr<share::HostShare> share_;  // Note [Shared pins]; null when not shared
  BudgetGate gate_;  // its own leaf lock

  mutable Mutex mu_;
  Config config_ PINS_GUARDED_BY(mu_);
  PinTable table_ PINS_GUARDED_BY(mu_);
  bool prompt_ PINS_GUARDED_BY(mu_) = false;
  int64_t pressure_freed_ PINS_GUARDED_BY(mu_) = 0;  // SUM bytes freed by relieve()
  int64_t relieve_calls_ PINS_GUARDED_BY(mu_) = 0;   // COUNT
  std::atomic<int64_t> plain_copies_{0};              // COUNT casts without a model
  // Note [Pressure from others]: the headroom and the pin reserve line as
  // configured; the pool's committed bytes and available RAM when relieve()
  // last ran (none yet: 0 and all of it).
  std::atomic<uint64_t> headroom_{0};
  std::atomic<uint64_t> reserve_line_{0};
  std::atomic<uint64_t> relieved_committed_{0};
  std::atomic<uint64_t> relieved_available_{UINT64_MAX};
};

}  // namespace pins
