#include "csrc/balancer/eviction.h"

#include <algorithm>

namespace pins {

int tier_of(const Pin& p, const Model& m) {
  const bool in_prompt = m.in_prompt || m.active;
  const bool streaming = is_streaming(p.subset);
  if (!in_prompt) return streaming ? 1 : 2;
  if (!streaming) return 3;
  return m.active ? 5 : 4;
}

std::vector<Candidate> eviction_order(const Models& models, Reach reach, PolicyKind policy,
                                      const TraceRecorder& trace) {
  struct Row {
    Candidate c;
    const Model* m;
    uint64_t next_use;
  };
  std::vector<Row> rows;
  for (const auto& [id, m] : models)
    for (int s = 0; s < kSubsets; ++s)
      for (const auto& [created, p] : m->by_created[s]) {
        const int tier = tier_of(*p, *m);
        if (tier > last_tier(reach)) continue;
        rows.push_back({{p, tier}, m.get(), 0});
      }
  if (policy == PolicyKind::Trace && trace.following()) {
    // Note [Trace policy]: farthest predicted next use first.
    for (Row& r : rows)
      r.next_use = trace.next_use({r.c.pin->model, is_patch(r.c.pin->subset) ? Kind::Patches : Kind::Weights, r.c.pin->key});
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      if ((a.c.tier == 5) != (b.c.tier == 5)) return b.c.tier == 5;  // active streaming pins last
      if (a.next_use != b.next_use) return a.next_use > b.next_use;
      if (a.c.pin->bytes != b.c.pin->bytes) return a.c.pin->bytes > b.c.pin->bytes;
      return a.c.pin->created > b.c.pin->created;
    });
  } else if (policy == PolicyKind::Lru) {
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      if (a.c.tier != b.c.tier) return a.c.tier < b.c.tier;
      if (a.m->load_seq != b.m->load_seq) return a.m->load_seq < b.m->load_seq;
      if (a.c.pin->last_use != b.c.pin->last_use) return a.c.pin->last_use < b.c.pin->last_use;
      return a.c.pin->created < b.c.pin->created;
    });
  } else {
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      if (a.c.tier != b.c.tier) return a.c.tier < b.c.tier;
      if (a.m->load_seq != b.m->load_seq) return a.m->load_seq > b.m->load_seq;
      return a.c.pin->created > b.c.pin->created;
    });
  }
  std::vector<Candidate> out;
  out.reserve(rows.size());
  for (const Row& r : rows) out.push_back(r.c);
  return out;
}

}  // namespace pins
