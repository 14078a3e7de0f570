// The pin table: every registered model and its pins, in the four subsets and
// in the indexes the eviction order walks, with what the policies record to
// order them. The balancer (balancer.h) owns one and guards it with its lock;
// the table itself takes no lock and frees no memory: a pin it drops hands its
// block to the caller's `to_free`, which the balancer gives back to the pool
// outside its lock (Note [Balancer locking]).
//
// What it keeps, each kept current as pins are linked, used and dropped:
// - the models by id (registry.h), each pin in its model's subset map and in
//   the indexes by creation, by use and, for the policies that need them, by
//   predicted reuse (Note [Reuse policy]) and by trace rank (Note [Trace index]);
// - the source index, every linked pin by the storage it copies (Note [Source
//   index]), and the reclaim ring (Note [Dead source reclaim]);
// - pins unlinked while a lease or an eviction still held them (orphans),
//   freed when the last holder lets go;
// - the counters of casts: per model and subset (SubsetStats), and why casts
//   were served from the source (Bypass), forgotten models included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "csrc/balancer/eviction.h"
#include "csrc/balancer/reclaim_ring.h"
#include "csrc/balancer/registry.h"
#include "csrc/balancer/reuse.h"
#include "csrc/balancer/source_index.h"
#include "csrc/balancer/stats.h"
#include "csrc/balancer/trace.h"
#include "csrc/config/config.h"

namespace pins {

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
  // A contiguous single source's first byte, whose pin may be shared (Note
  // [Shared pins]) when it lies in a mapped file; null otherwise.
  const void* data = nullptr;
  std::vector<SourcePart> parts;       // a gathered pin: every source in order; empty for one
  const char* op = "cast_to_device";   // names the caller in the error for a model not registered
};

// Whom a walk of the eviction order frees for: a new pin of `model` in
// `target` (of source `key`, when given), or nobody in particular (an explicit
// free, relieve(), page-lock drops). Note [Miss cost], Note [Idle cache pins],
// Note [First-seen models] and Note [Trace bypass] (trace.h) say what it changes.
struct Asker {
  ModelId model = -1;
  std::optional<Subset> target;
  const PinKey* key = nullptr;
};

// Note [Miss cost]
// What a pin saves is what its miss would cost. A weight's source is a file
// (pins.load_file, a loader's mapping, weights read back after an unload): a
// miss reads the disk unless the page cache still holds it. A patch tensor
// (LoRA factors) lives in process memory: a miss is a RAM copy. So the eviction
// order walks the patch subsets before the weight subsets, in every policy and
// every tier: a free, relieve() and a page-lock drop take patch pins within
// their reach before any weight pin; a new weight pin may take patch pins of
// any tier, active models' included (the next cast of a factor copies it from
// RAM); a new patch pin takes patch pins only, and is refused rather than
// evicting a weight pin. Within each part the tiers and the policy order as
// before (Note [Pin eviction tiers]). A weight pin whose source sits in process
// memory (a model built in RAM) is ranked as a file's: the kind says the cost,
// which keeps the walk O(k) (a mask of subsets, no per-pin test).
//
// Note [Idle cache pins]
// A cache (-loaded) pin serves a layer that stays on the device. When its model
// ran through a whole prompt and the pin was not used in it, the layer stayed
// on the device all that prompt: the pin is the likeliest of all to go unused,
// so the walk takes such pins first (each model's, least recently used first),
// before the tiers. Model::idle_through is set at end_prompt for the models in
// the prompt; a pin last used at or before it is idle. And a new cache pin of a
// model never evicts its own model's pins of that subset: loading a model layer
// by layer, evicting its own newest layer to pin the next gains nothing and
// reads the disk once more (the walk stops there; the pin is refused instead).
// While the trace policy follows a record, Note [Trace bypass] decides instead,
// by predicted next use: the layers the load pinned are used before the new
// one and stay, but the pin of a layer that stayed on the device, which only an
// older record used, may go. The rule kept it and refused a layer the model
// loads every prompt, which then came from disk every prompt. Nor are idle
// pins taken first while the trace is followed: a layer that stayed on the
// device through seed changes is loaded again when the text changes and the
// encoder takes the device, which the full prompt's record says; the
// prediction ranks the idle pin like any other (issue 39's third round,
// docs/SIMULATOR.md).
//
// Note [First-seen models]
// Under the trace policy, a new cache (-loaded) pin of a model that no kept
// record accessed (a workflow's first prompt, or a one-off between runs of the
// usual one) takes no weight pin of the last prompt's workflow (the models of
// the kept records that share a sampler with the last prompt,
// TraceRecorder::last_workflow_models). It takes idle cache pins, patch pins
// and the pins of any other model as the order says, gets free room, or is
// refused and copied from its source through the page cache. Such a layer is
// copied once per load and nothing predicts its next use, while the workflow
// it interrupts is likely to come back. The model's streamed layers (used
// every step) evict as before, and once a record knows the model (after its
// first prompt) the order and Note [Trace bypass] decide; in the first prompt
// of all, with no record, every pin stays. Since issue 39 a first-seen
// workflow is not taken for a one-off where the evidence says otherwise: pins
// of workflows that have not run since the last one are not spared; nothing is
// spared when the last workflow ran once and was new itself (a detour, as
// Qwen-Image once between SD3.5 and HiDream); and the rule has a check of its
// own (Note [Rule checks], rule_check.h): when the new model runs again before
// the workflow it spared, the rule stops until it is right twice. When it
// landed (1e74997), on suite seeds 1-5, 49 -> 39 scenarios read more than the
// lesser of lru and mru plus a layer a run; what the limits and the check
// change: docs/SIMULATOR.md "Rules with a check of their own".
// Before the check's first verdict the rule applies only where the records
// show the user's workflows taking turns: of the kept records that came first
// in their workflow's streak (Note [Trace context]), more were followed by
// another workflow than by their own (TraceRecorder::streaks_go_on). Where the
// user runs each workflow again and again (a a b, a a a b), a new workflow is
// taken for the next loop, not a one-off: its loaded layers take the pins of
// the workflow it follows, as issue 39 asks. (The rule had applied until its
// first wrong verdict, so a new workflow that repeats at once read its loaded
// layers again in its second prompt, whatever the check learned after.) On
// pins-sim's held-out sets 1-7, 15 -> 11 of 280 scenarios read more than
// min(lru, mru) plus a layer, on sets 8-15 13 -> 9 of 320, suite seeds 1-5 14
// -> 15 of 1,000 (docs/SIMULATOR.md, "Issue 39's third round").
// Where the streaks go on, before that first verdict, the new model's loaded
// layers still take no pin of the last workflow's streamed layers (its
// Subset::Weights, a Spare of one subset): they take its loaded layers' pins,
// and the pins of any other workflow. A loaded layer is copied once a load,
// while a streamed one is cast every step of the loop it belongs to, so if the
// new workflow was a one-off the loop comes back to its streamed layers
// pinned, and if it repeats it reads only what its loaded layers could not
// take. On pins-sim's held-out sets 1-23, 24 -> 21 of 920 scenarios read more
// than min(lru, mru) plus a layer a run; suite seeds 1-5 14 -> 11 of 1,000,
// and with ComfyUI's marking (--mark on-use) 22 -> 16 (docs/SIMULATOR.md,
// "Issue 39's fourth round").
//
// Note [Spared layers on the device]
// A spared workflow's cache pins serve its loaded layers when it comes back;
// a layer still on its device then is not loaded again, and its pin saves
// nothing. Pins sees loads, not unloads, so the application says what stays:
// Balancer::set_device_bytes (pins.set_device_bytes; ComfyUI's integration
// reports ModelPatcher.loaded_size() of model_size() after each load and
// unload). Of a spared model's cache (-loaded) weight pins, at least their
// bytes less the model's bytes off the device are of layers on the device.
// The new pin of a first-seen model takes up to that many bytes of them,
// farthest predicted use first, before the rest of the walk; the pins beyond
// it stay spared. A model whose device bytes were never said keeps every pin.
// On pins-sim's held-out sets 1-47 (the sim says what its expansion keeps on
// the device, as ComfyUI's integration does), 37 -> 34 of 1,880 scenarios
// read more than min(lru, mru) plus a layer a run, and two of the four that
// read more than 1.25x mru no longer do (u33-18 1.87x -> 1.12x, u38-6 1.68x
// -> 0.92x); suite seeds 1-5 10 -> 10 of 1,000. Taking the lower bound, not
// the pins of exactly the layers on the device (which no application can say
// under ComfyUI's dynamic VRAM), read no more: 35 over with those
// (docs/SIMULATOR.md, "Issue 39's seventh round").
class PinTable {
 public:
  explicit PinTable(PolicyKind policy);
  PinTable(const PinTable&) = delete;
  PinTable& operator=(const PinTable&) = delete;

  // ---- models
  ModelId add_model(std::string name, std::string load_device, ModelOptions options);
  // The model `id`; a pins::ValueError naming `what` when it is not registered.
  Model& model(ModelId id, const char* what);
  const Model& model(ModelId id, const char* what) const;
  Model* find_model(ModelId id);
  bool has_model(ModelId id) const { return models_.count(id) != 0; }
  Models& models() { return models_; }
  const Models& models() const { return models_; }
  // Drops every pin of `id` and the model; its COUNTs and SUMs stay in the totals.
  void forget_model(ModelId id, std::vector<void*>& to_free);
  // Active: executing now. Becoming active counts as being loaded again (moves
  // the model to the front of the load order).
  void set_active(Model& m, bool active);

  // ---- the policy and what it records (policy_indexes.cpp)
  PolicyKind policy() const { return policy_; }
  // Keeps the indexes the new policy walks, and only those.
  void set_policy(PolicyKind policy);
  // A cast's access to `r`'s source: recorded for the trace and reuse policies
  // (re-ranking the pins the access moves), the clock and m's last use moved.
  // Returns the source's prompt gap under the reuse policy (0 otherwise).
  uint64_t record_access(Model& m, const Request& r);
  // The prompt boundary: the trace's record becomes the reference, the reuse
  // history closes the prompt, and the models in it (`in_prompt` or `active`)
  // take the prompt's start as their idle_through (Note [Idle cache pins]).
  void end_prompt();
  // A prompt starts: its start on the clock (Note [Idle cache pins]).
  void start_prompt() { prompt_start_ = clock_; }
  // The current prompt marked `models` (Note [Trace marks]).
  void mark_prompt(const std::vector<ModelId>& models) { trace_.mark(models); }
  // The simulator's clairvoyant reuse policy (ReuseHistory::set_future).
  void set_reuse_future(ReuseHistory::Future future) { reuse_.set_future(std::move(future)); }
  // The eviction order of `reach` for `asker`, walked until `visit` returns
  // false: idle cache pins, then patch pins, then weight pins (Notes [Idle
  // cache pins], [Miss cost], [Eviction walk]). `visit` may mark pins, not link
  // or unlink them; it sees each pin once.
  void walk(Reach reach, const std::function<bool(const Candidate&)>& visit, const Asker& asker = {});
  // Note [Trace index]: pins the by_trace indexes list at another rank than
  // the recorder's now, or miss, while they are kept current (none otherwise). O(pins).
  std::optional<size_t> trace_index_faults() const;

  // ---- pins
  // The pin of `r`'s source in m's subset `s`, when it serves r (Note [Pin
  // validity]) or is being evicted (the caller copies from the source); a
  // stale one is dropped into `to_free` and nullptr returned.
  Pin* lookup(Model& m, Subset s, const Request& r, std::vector<void*>& to_free);
  // Whether m holds a pin of (kind, key) in either subset of that kind.
  bool holds(const Model& m, Kind kind, const PinKey& key) const;
  // A hit on `p`: its last use is now, its reuse gap `reuse_gap`.
  void touch(Model& m, Pin* p, uint64_t reuse_gap);
  // A new pin of `r` in m's subset `target` over `block`, being filled by the
  // one lease the caller hands out.
  Pin* create(Model& m, const Request& r, Subset target, void* block, uint64_t reuse_gap,
              std::unique_ptr<SourceGuard> guard);
  // Takes `p` out of its model, the indexes and the ring. Nobody holding it:
  // its block goes to `to_free`; else it is an orphan, freed by reap_orphan()
  // when its last holder lets go.
  void unlink(Pin* p, std::vector<void*>& to_free);
  void reap_orphan(Pin* p, std::vector<void*>& to_free);  // frees a detached pin
  // Drops (counted as `dropped`, and `invalidated` when asked) the pins of m's
  // subset s for which `pred` holds; returns their bytes.
  size_t drop_if(Model& m, Subset s, const std::function<bool(const Pin&)>& pred, std::vector<void*>& to_free,
                 bool invalidated = false);
  // Drops (as invalidated) every pin, whatever its state, with a source whose
  // bytes overlap [begin, end) of `storage`; returns their bytes.
  size_t drop_overlapping(uint64_t storage, uint64_t begin, uint64_t end, std::vector<void*>& to_free);
  // Note [Dead source reclaim]: checks the next `checks` slots of the ring and
  // drops the pins whose source died; returns their bytes.
  size_t reclaim(size_t checks, std::vector<void*>& to_free);
  // Every block the table holds, linked or orphaned; the table is empty after.
  void release_all(std::vector<void*>& to_free);
  // Every linked pin, each model's oldest first.
  template <typename F>
  void for_each_pin(F&& f) const {
    for (const auto& [id, m] : models_)
      for (int s = 0; s < kSubsets; ++s)
        for (const auto& [created, p] : m->by_created[s]) f(*p);
  }

  // ---- counters
  SubsetStats& stats_of(const Pin& p) { return models_.at(p.model)->stats[static_cast<int>(p.subset)]; }
  // A cast of `model` (which may be gone) served from the source, and why.
  void bypass(ModelId model, Bypass why);
  // A hit on a pin another thread is filling or evicting.
  void busy_miss(ModelId model) {
    busy_misses_++;
    bypass(model, Bypass::Busy);
  }
  // The table's part of BalancerStats: models, subsets, totals, the cast
  // counters and the policies' levels.
  void collect(BalancerStats& out) const;

 private:
  // Links a new pin into its model's subset, the indexes, the source index and the ring.
  void link(Model& m, std::unique_ptr<Pin> pin);
  // Note [Reuse policy]: p into its model's by_reuse (after a use), out of it;
  // every pin in or out (a change of policy).
  void reuse_index(Model& m, Pin* p);
  void reuse_unindex(Model& m, Pin* p);
  void set_reuse_indexes(bool on);
  // Note [Trace index]: whether the models' by_trace indexes hold every pin at
  // its rank now; the pins of `keys` ranked again; every pin ranked again (at
  // the first decision of a generation); the indexes emptied (another policy).
  bool trace_index_current() const;
  // Note [Spared layers on the device]: walks, for a new pin of a first-seen
  // model, the cache pins of the models `spare` covers that serve layers on their device.
  void walk_spared_on_device(Reach reach, const Spare& spare, const std::function<bool(const Candidate&)>& visit,
                             const ReuseView& reuse);
  void retrace(const std::vector<TraceKey>& keys);
  void rebuild_trace_index();
  void clear_trace_index();

  Models models_;
  ModelId next_model_ = 0;
  uint64_t seq_ = 0;    // load order and pin creation order
  uint64_t clock_ = 0;  // accesses
  uint64_t prompt_start_ = 0;  // clock_ when the prompt started (Note [Idle cache pins])
  SourceIndex sources_;  // every linked pin by source storage (Note [Source index])
  ReclaimRing ring_;     // every linked pin (Note [Dead source reclaim])
  std::unordered_map<Pin*, std::unique_ptr<Pin>> orphans_;  // detached pins still held

  PolicyKind policy_;
  TraceRecorder trace_;  // recorded under the trace policy only
  ReuseHistory reuse_;   // recorded under the reuse policy only (Note [Reuse policy])
  bool reuse_on_ = false;  // the models' by_reuse indexes are kept
  // Note [Trace index]: the trace_ generation the by_trace indexes were ranked
  // at (kNoTraceIndex: none), and the keys an access re-ranks (kept for its capacity).
  static constexpr uint64_t kNoTraceIndex = ~uint64_t{0};
  uint64_t trace_generation_ = kNoTraceIndex;
  std::vector<TraceKey> trace_moved_;

  int64_t refusals_ = 0;                    // COUNT
  int64_t busy_misses_ = 0;                 // COUNT hits on a pin still filling or being evicted
  int64_t bypassed_[kBypassReasons] = {};   // COUNT by reason, forgotten models included
  SubsetStats retired_[kSubsets];           // COUNTs and SUMs of forgotten models (levels 0)
};

}  // namespace pins
