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
//         no -loaded pins are created (the behaviour before the seed)
//   trace the pin whose predicted next use is farthest first (larger first on a
//         tie), over tiers 1-4 as allowed, while the prompt follows the previous
//         prompt's recorded accesses; mru for the rest of a prompt that departs
//         from the record (Note [Trace policy] in trace.h)
// A pin with a lease out or a copy in flight is skipped (and counted), never freed.
#pragma once

#include <vector>

#include "csrc/balancer/registry.h"
#include "csrc/balancer/trace.h"
#include "csrc/runtime/config.h"

namespace pins {

// The last tier a freeing may take pins from.
enum class Reach : int {
  SparePromptStreaming = 3,  // tiers 1-3: room for a new cache (-loaded) pin
  SpareActive = 4,           // tiers 1-4: room for a new streaming pin, relieve(), free(), page-lock drops
  All = 5,                   // tiers 1-5: free() with evict_active
};
inline int last_tier(Reach r) { return static_cast<int>(r); }

// A pin's tier (1-5) as its model stands now.
int tier_of(const Pin& p, const Model& m);

struct Candidate {
  Pin* pin;
  int tier;
};

// Every pin of `models` within `reach`, first to free first, as `policy` orders
// them; `trace` gives the trace policy's predictions while it is followed.
std::vector<Candidate> eviction_order(const Models& models, Reach reach, PolicyKind policy,
                                      const TraceRecorder& trace);

}  // namespace pins
