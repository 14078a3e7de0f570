// The balancer: keeps the pins of every registered model, creates them on the
// cast path within the RAM budget, and evicts along the priority tiers.
//
// Note [Pin eviction tiers]
// Freeing walks these tiers in order until enough is freed (DESIGN.md):
//   1. streaming pins of models not in the current prompt
//   2. cache (-loaded) pins of models not in the current prompt
//   3. cache pins of models in the current prompt
//   4. streaming pins of inactive models in the prompt: only for a streaming
//      request, relieve() and free()
//   5. streaming pins of active models: only when evict_active
// An active model counts as in the prompt. Within a tier the policy orders:
//   mru   models most recently loaded first, pins newest first (the default)
//   lru   models least recently loaded first, pins least recently used first;
//         no -loaded pins are created (the behaviour before the seed)
//   trace the pin whose predicted next use is farthest first (larger first on a
//         tie), over tiers 1-4 as allowed, while the prompt follows the previous
//         prompt's recorded accesses; mru for the rest of a prompt that departs
//         from the record (Note [Trace policy])
// A pin with a lease out or a copy in flight is skipped (and counted), never freed.
//
// Note [Trace policy]
// Under the trace policy, every acquire() appends (model, kind, key) to the
// current prompt's record (up to kTraceLimit accesses: a longer prompt keeps
// none); at end_prompt() it joins the last kTraceRecords prompts' records. A
// change of policy leaves the rest of the prompt to mru. The new prompt
// follows each record in order (each next access found within a short window
// ahead of that record's cursor; a patch access that is not found, as after a
// LoRA swap, is skipped) until it departs from it. While some record is still
// followed, a pin's next use is its nearest next position, over the followed
// records, at or after their cursors. A pin that none of them uses again is
// next used by the prompt that came after the active record (the most recent
// followed one) the last time: the current prompt itself when the active record
// is the last prompt's (a rerun), the other workflow when prompts alternate; its
// next use is the rest of the active record plus its first position there. A pin
// only the active record's past used comes one prompt later still; one no record
// knows is never used again.
//
// Note [Balancer locking]
// One mutex, mu_, guards the registry and the counters. Lock order: mu_ may be
// held while taking HostPool's mutex for non-blocking queries (is_locked,
// stats); never the reverse. No pool allocation or free, no fence query, no
// /proc read happens under mu_: victims are chosen and marked Evicting under
// mu_, checked for copies in flight and freed outside it, and unlinked under
// mu_ again.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "csrc/pool/pool.h"
#include "csrc/runtime/config.h"
#include "csrc/balancer/registry.h"
#include "csrc/system/sysmem.h"

namespace pins {

class Balancer;

// A cast's hold on a pin: the pin is neither evicted nor reused while the lease
// lives. An empty lease means "no pin": copy straight from the source.
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
  Balancer(const Config& config, HostPool& pool, MemoryProbe& probe);
  ~Balancer();
  Balancer(const Balancer&) = delete;
  Balancer& operator=(const Balancer&) = delete;

  // Policy, fast-disk and budget constants; pool settings stay as built.
  void configure(const Config& config);
  Config config() const;

  // ---- models
  ModelId register_model(std::string name, std::string load_device);
  void forget_model(ModelId model);  // frees all its pins
  // Active: executing now. Becoming active counts as being loaded again (moves
  // the model to the front of the load order).
  void set_active(ModelId model, bool active);
  bool has_model(ModelId model) const;

  // ---- prompts
  void mark_prompt(const std::vector<ModelId>& models);  // starts a prompt if none
  void end_prompt();  // the boundary: clears marks, drops `patches`, rolls the trace
  bool prompt_running() const;

  // ---- the cast path (DESIGN.md "Choosing and creating a pin")
  // `make_guard` is called only when a pin is created.
  Lease acquire(const Request& r, const std::function<std::unique_ptr<SourceGuard>()>& make_guard = {});

  // ---- budget
  // Makes room for a new pin of `bytes`: true when it may be created.
  bool ensure_budget(size_t bytes, bool streaming);
  // Frees at least `bytes`: pins of dead sources first, then along tiers 1-4
  // (and 5 when evict_active); returns the bytes freed.
  size_t free(size_t bytes, bool evict_active = false);
  // The RAM-pressure check: frees (headroom - available) + relieve_slack when positive.
  size_t relieve();
  // Drops pins whose source died; returns their bytes.
  size_t sweep();

  // ---- stats
  std::vector<std::pair<std::string, int64_t>> stats() const;
  SubsetStats subset_stats(ModelId model, Subset s) const;
  struct PinInfo {
    ModelId model;
    Subset subset;
    PinKey key;
    size_t bytes;
    bool locked;
  };
  std::vector<PinInfo> pins() const;  // every live pin, for tests and tools
  HostPool& pool() { return pool_; }

 private:
  friend class Lease;
  struct Candidate {
    Pin* pin;
    int tier;
  };
  struct TraceKey {
    ModelId model;
    Kind kind;
    PinKey key;
    bool operator==(const TraceKey&) const = default;
  };
  struct TraceKeyHash {
    size_t operator()(const TraceKey& k) const {
      return PinKeyHash{}(k.key) ^ (static_cast<size_t>(k.model) * 31 + static_cast<size_t>(k.kind));
    }
  };

  void release(Pin* pin);
  void mark_filled(Pin* pin);
  Model& model_locked(ModelId id, const char* what);  // LOCK: mu_
  const Model& model_locked(ModelId id, const char* what) const;  // LOCK: mu_
  Pin* find_locked(Model& m, Subset s, const Request& r, std::vector<void*>& to_free);  // LOCK: mu_
  void unlink_locked(Pin* p, std::vector<void*>& to_free);  // LOCK: mu_
  int tier_locked(const Pin& p, const Model& m) const;  // LOCK: mu_
  std::vector<Candidate> order_locked(bool streaming_request, bool evict_active);  // LOCK: mu_
  void record_access_locked(const Request& r);  // LOCK: mu_
  size_t free_along_tiers(size_t bytes, bool streaming_request, bool evict_active);
  // Registration ceiling: whether a new pin of `bytes` may be page-locked,
  // after dropping page-locks along the tiers if needed.
  bool ensure_lock_room(size_t bytes, const MemoryInfo& mi);
  void free_blocks(const std::vector<void*>& blocks);
  SubsetStats& stats_locked(const Pin& p);  // LOCK: mu_ its model's counters for its subset
  void reap_orphan_locked(Pin* p, std::vector<void*>& to_free);  // LOCK: mu_ frees a detached pin
  void refused_locked(ModelId model);  // LOCK: mu_ counts a refusal (the model may be gone)
  // LOCK: mu_ drops (counted as `dropped`) the pins of m's subset s that match; returns their bytes.
  size_t drop_if_locked(Model& m, Subset s, const std::function<bool(const Pin&)>& pred,
                        std::vector<void*>& to_free);
  bool ensure_budget(size_t bytes, bool streaming, const MemoryInfo& mi);

  HostPool& pool_;
  MemoryProbe& probe_;

  mutable std::mutex mu_;
  Config config_;                                   // LOCK: mu_
  std::map<ModelId, std::unique_ptr<Model>> models_;  // LOCK: mu_
  std::unordered_map<Pin*, std::unique_ptr<Pin>> orphans_;  // LOCK: mu_ detached pins with leases out
  ModelId next_model_ = 0;                          // LOCK: mu_
  uint64_t seq_ = 0;                                // LOCK: mu_ load order and pin creation order
  uint64_t clock_ = 0;                              // LOCK: mu_ accesses
  bool prompt_ = false;                             // LOCK: mu_
  // Trace policy (Note [Trace policy]).
  struct TraceRecord {
    std::vector<TraceKey> keys;
    std::unordered_map<TraceKey, std::vector<uint32_t>, TraceKeyHash> pos;
    size_t cursor = 0;      // the current prompt follows it up to here
    bool departed = false;  // the current prompt left it
  };
  static constexpr size_t kTraceRecords = 4;
  static constexpr size_t kTraceLimit = size_t{1} << 20;  // accesses kept per prompt record
  uint64_t trace_next_use_locked(const TraceKey& k) const;  // LOCK: mu_
  std::vector<TraceKey> trace_now_;                 // LOCK: mu_
  std::unordered_map<TraceKey, uint32_t, TraceKeyHash> trace_now_first_;  // LOCK: mu_
  std::deque<TraceRecord> trace_records_;           // LOCK: mu_ the last prompts' records, most recent first
  bool departed_ = true;                            // LOCK: mu_ every record departed
  bool trace_overflow_ = false;                     // LOCK: mu_ this prompt passed kTraceLimit
  // Global counters.
  int64_t refusals_ = 0;                            // LOCK: mu_ COUNT
  int64_t pressure_freed_ = 0;                      // LOCK: mu_ SUM bytes freed by relieve()
  int64_t relieve_calls_ = 0;                       // LOCK: mu_ COUNT
  int64_t busy_misses_ = 0;                         // LOCK: mu_ COUNT hits on a pin still filling
  int64_t trace_departures_ = 0;                    // LOCK: mu_ COUNT
};

}  // namespace pins
