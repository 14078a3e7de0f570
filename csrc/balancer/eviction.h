// The order in which pins are freed: the tiers and, within them, the policy.
//
// Note [Pin eviction tiers]
// Freeing walks these tiers in order until enough is freed (DESIGN.md):
//   1. streaming pins of models not in the current prompt
//   2. cache (-loaded) pins of models not in the current prompt
//   3. cache pins of models in the current prompt
//   4. streaming pins of inactive models in the prompt: only for a streaming
//      request, relieve() and free()
//   5. streaming pins of active models: only when evict_active
// An active model counts as in the prompt. How far a freeing may go is its
// Reach. Within a tier the policy orders:
//   mru   models most recently loaded first, pins newest first (the default)
//   lru   models least recently loaded first, pins least recently used first;
//         no -loaded pins are created (the scheme that cascades, a baseline)
//   trace the pin whose predicted next use is farthest first (larger first on a
//         tie), over tiers 1-4 as allowed, while the prompt follows the previous
//         prompt's recorded accesses; mru for the rest of a prompt that departs
//         from the record (Note [Trace policy] in trace.h)
// A pin with a lease out or a copy in flight is skipped (and counted), never freed.
//
// Note [Eviction walk]
// eviction_order() builds the whole order (every pin, sorted): the reference,
// and what the simulator's clairvoyant order does (its predictions move with
// every access). walk_eviction_order() yields the same order lazily from
// indexes the balancer keeps up to date as pins are made, used and dropped:
// Model::by_created (mru: newest first), Model::by_use (lru: least recently
// used first), Model::by_reuse (Note [Reuse policy]) and Model::by_trace (the
// trace policy while it follows a record, Note [Trace index]). The models are sorted once
// per walk (there are few), and within a tier each model's one or two subsets
// of that tier are merged as they are walked, so a decision that stops after k
// pins costs O(models log models + k) whatever the number of pins.
#pragma once

#include <functional>
#include <unordered_set>
#include <vector>

#include "csrc/balancer/registry.h"
#include "csrc/balancer/reuse.h"
#include "csrc/balancer/trace.h"
#include "csrc/config/config.h"

namespace pins {

// The last tier a freeing may take pins from.
enum class Reach : int {
  SparePromptStreaming = 3,  // tiers 1-3: room for a new cache (-loaded) pin, free() with `loaded`
  SpareActive = 4,           // tiers 1-4: room for a new streaming pin, relieve(), free(), page-lock drops
  All = 5,                   // tiers 1-5: free() with evict_active
};
inline int last_tier(Reach r) { return static_cast<int>(r); }

// A pin's tier (1-5) as its model stands now.
int tier_of(const Pin& p, const Model& m);
// The tier of every pin of subset `s` of `m`.
int tier_of(Subset s, const Model& m);

// Sets of subsets, a bit each (1 << Subset), for the walks below: Note [Miss
// cost] in pin_table.h walks the patch subsets and the weight subsets apart.
constexpr unsigned subset_bit(Subset s) { return 1u << static_cast<int>(s); }
constexpr unsigned kAllSubsets = (1u << kSubsets) - 1;
constexpr unsigned kPatchSubsets = subset_bit(Subset::Patches) | subset_bit(Subset::PatchesLoaded);
constexpr unsigned kWeightSubsets = subset_bit(Subset::Weights) | subset_bit(Subset::WeightsLoaded);

// Pins a walk leaves out (Note [First-seen models]): those of `subsets` of the
// `models`, a subset at a time (O(1) a subset, not a pin).
struct Spare {
  const std::unordered_set<ModelId>* models = nullptr;
  unsigned subsets = kAllSubsets;
  bool covers(ModelId id, Subset s) const {
    return models != nullptr && (subsets & subset_bit(s)) && models->count(id) != 0;
  }
};

struct Candidate {
  Pin* pin;
  int tier;
};

// The reuse policy's view: its history and the clock now (Note [Reuse policy]).
// Without a history the reuse policy orders as mru.
struct ReuseView {
  const ReuseHistory* history = nullptr;
  uint64_t now = 0;
};

// Every pin of `models` within `reach` and in `subsets`, first to free first,
// as `policy` orders them; `trace` gives the trace policy's predictions while
// it is followed, `reuse` the reuse policy's.
std::vector<Candidate> eviction_order(const Models& models, Reach reach, PolicyKind policy,
                                      const TraceRecorder& trace, const ReuseView& reuse = {},
                                      unsigned subsets = kAllSubsets);

// The same order (Note [Eviction walk]), handed to `visit` one candidate at a
// time until it returns false. The models' by_created and by_use indexes (and
// by_reuse under the reuse policy, by_trace at `trace`'s ranks while the trace
// policy follows a record) must list their pins. `visit` must not
// change the registry. The pins `spare` covers are left out.
void walk_eviction_order(const Models& models, Reach reach, PolicyKind policy, const TraceRecorder& trace,
                         const std::function<bool(const Candidate&)>& visit, const ReuseView& reuse = {},
                         unsigned subsets = kAllSubsets, Spare spare = {});

}  // namespace pins
