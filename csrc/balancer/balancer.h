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
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "csrc/balancer/eviction.h"
#include "csrc/balancer/registry.h"
#include "csrc/balancer/stats.h"
#include "csrc/balancer/trace.h"
#include "csrc/base/thread_safety.h"
#include "csrc/pool/pool.h"
#include "csrc/runtime/config.h"
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
  friend class Balancer;
  Balancer* owner_ = nullptr;
  Pin* pin_ = nullptr;
  bool hit_ = false;
  bool fill_ = false;
};

struct Request {
  ModelId model = -1;
  PinKey key;
  size_t bytes = 0;
  Kind kind = Kind::Weights;
  bool resident = false;               // the copy stays on the device
  std::optional<int64_t> signature;    // patch set (patches only)
  uint64_t version = 0;                // the source's version counter now
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
  ModelId register_model(std::string name, std::string load_device) PINS_EXCLUDES(mu_);
  void forget_model(ModelId model) PINS_EXCLUDES(mu_);  // frees all its pins
  // Active: executing now. Becoming active counts as being loaded again (moves
  // the model to the front of the load order).
  void set_active(ModelId model, bool active) PINS_EXCLUDES(mu_);
  bool has_model(ModelId model) const PINS_EXCLUDES(mu_);

  // ---- prompts
  void mark_prompt(const std::vector<ModelId>& models) PINS_EXCLUDES(mu_);  // starts a prompt if none
  void end_prompt() PINS_EXCLUDES(mu_);  // the boundary: clears marks, drops `patches`, rolls the trace
  bool prompt_running() const PINS_EXCLUDES(mu_);

  // ---- the cast path (DESIGN.md "Choosing and creating a pin")
  // `make_guard` is called only when a pin is created.
  Lease acquire(const Request& r, const std::function<std::unique_ptr<SourceGuard>()>& make_guard = {})
      PINS_EXCLUDES(mu_);

  // ---- budget (DESIGN.md "Budget", budget.h)
  // Frees at least `bytes`: pins of dead sources first, then along tiers 1-4
  // (and 5 when evict_active); returns the bytes freed.
  size_t free(size_t bytes, bool evict_active = false) PINS_EXCLUDES(mu_);
  // The RAM-pressure check: frees (headroom - available) + relieve_slack when positive.
  size_t relieve() PINS_EXCLUDES(mu_);
  // Drops pins whose source died; returns their bytes.
  size_t sweep() PINS_EXCLUDES(mu_);

  // ---- stats
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

 private:
  friend class Lease;

  void release(Pin* pin) PINS_EXCLUDES(mu_);
  void mark_filled(Pin* pin) PINS_EXCLUDES(mu_);
  Model& model_locked(ModelId id, const char* what) PINS_REQUIRES(mu_);
  const Model& model_locked(ModelId id, const char* what) const PINS_REQUIRES(mu_);
  Pin* find_locked(Model& m, Subset s, const Request& r, std::vector<void*>& to_free) PINS_REQUIRES(mu_);
  void unlink_locked(Pin* p, std::vector<void*>& to_free) PINS_REQUIRES(mu_);
  std::vector<Candidate> order_locked(Reach reach) const PINS_REQUIRES(mu_);
  size_t free_along_tiers(size_t bytes, Reach reach) PINS_EXCLUDES(mu_);
  // Makes room for a new pin of `bytes` in `target`: true when it may be created.
  bool ensure_budget(size_t bytes, Subset target, const MemoryInfo& mi) PINS_EXCLUDES(mu_);
  // Registration ceiling: whether a new pin of `bytes` may be page-locked,
  // after dropping page-locks along the tiers if needed.
  bool ensure_lock_room(size_t bytes, const MemoryInfo& mi) PINS_EXCLUDES(mu_);
  void free_blocks(const std::vector<void*>& blocks) PINS_EXCLUDES(mu_);  // into the pool, outside mu_
  SubsetStats& stats_locked(const Pin& p) PINS_REQUIRES(mu_);  // its model's counters for its subset
  void reap_orphan_locked(Pin* p, std::vector<void*>& to_free) PINS_REQUIRES(mu_);  // frees a detached pin
  void refused_locked(ModelId model) PINS_REQUIRES(mu_);  // counts a refusal (the model may be gone)
  // Drops (counted as `dropped`) the pins of m's subset s that match; returns their bytes.
  size_t drop_if_locked(Model& m, Subset s, const std::function<bool(const Pin&)>& pred,
                        std::vector<void*>& to_free) PINS_REQUIRES(mu_);

  HostPool& pool_;     // must outlive the balancer
  MemoryProbe& probe_;  // must outlive the balancer

  mutable Mutex mu_;
  Config config_ PINS_GUARDED_BY(mu_);
  Models models_ PINS_GUARDED_BY(mu_);
  std::unordered_map<Pin*, std::unique_ptr<Pin>> orphans_ PINS_GUARDED_BY(mu_);  // detached pins with leases out
  ModelId next_model_ PINS_GUARDED_BY(mu_) = 0;
  uint64_t seq_ PINS_GUARDED_BY(mu_) = 0;    // load order and pin creation order
  uint64_t clock_ PINS_GUARDED_BY(mu_) = 0;  // accesses
  bool prompt_ PINS_GUARDED_BY(mu_) = false;
  TraceRecorder trace_ PINS_GUARDED_BY(mu_);  // recorded under the trace policy only
  // Global counters (BalancerStats).
  int64_t refusals_ PINS_GUARDED_BY(mu_) = 0;        // COUNT
  int64_t pressure_freed_ PINS_GUARDED_BY(mu_) = 0;  // SUM bytes freed by relieve()
  int64_t relieve_calls_ PINS_GUARDED_BY(mu_) = 0;   // COUNT
  int64_t busy_misses_ PINS_GUARDED_BY(mu_) = 0;     // COUNT hits on a pin still filling
};

}  // namespace pins
