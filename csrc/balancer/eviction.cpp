#include "csrc/balancer/eviction.h"

#include <algorithm>
#include <iterator>

namespace pins {

int tier_of(Subset s, const Model& m) {
  const bool in_prompt = m.in_prompt || m.active;
  const bool streaming = is_streaming(s);
  if (!in_prompt) return streaming ? 1 : 2;
  if (!streaming) return 3;
  return m.active ? 5 : 4;
}

int tier_of(const Pin& p, const Model& m) { return tier_of(p.subset, m); }

std::vector<Candidate> eviction_order(const Models& models, Reach reach, PolicyKind policy,
                                      const TraceRecorder& trace, const ReuseView& reuse) {
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
  } else if (policy == PolicyKind::Reuse && reuse.history != nullptr) {
    // Note [Reuse policy]: farthest predicted next use first.
    for (Row& r : rows) r.next_use = reuse.history->next_use(*r.c.pin, reuse.now, r.c.tier > 2, r.m->active);
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

void walk_eviction_order(const Models& models, Reach reach, PolicyKind policy, const TraceRecorder& trace,
                         const std::function<bool(const Candidate&)>& visit, const ReuseView& reuse) {
  if ((policy == PolicyKind::Trace && trace.following()) || (policy == PolicyKind::Reuse && reuse.history)) {
    // Predictions move with every access: no index keeps them (Note [Eviction walk]).
    for (const Candidate& c : eviction_order(models, reach, policy, trace, reuse))
      if (!visit(c)) return;
    return;
  }
  const bool lru = policy == PolicyKind::Lru;
  std::vector<const Model*> ms;
  ms.reserve(models.size());
  for (const auto& [id, m] : models) ms.push_back(m.get());
  // mru: most recently loaded first; lru: least recently loaded first.
  std::sort(ms.begin(), ms.end(), [lru](const Model* a, const Model* b) {
    return lru ? a->load_seq < b->load_seq : a->load_seq > b->load_seq;
  });
  for (int tier = 1; tier <= last_tier(reach); ++tier) {
    for (const Model* m : ms) {
      int subsets[2], n = 0;
      for (int s = 0; s < kSubsets; ++s)
        if (tier_of(static_cast<Subset>(s), *m) == tier) subsets[n++] = s;
      if (n == 0) continue;
      if (lru) {
        // (last_use, created) ascending over the subsets of this tier.
        using It = std::map<std::pair<uint64_t, uint64_t>, Pin*>::const_iterator;
        It it[2], end[2];
        for (int i = 0; i < n; ++i) {
          it[i] = m->by_use[subsets[i]].begin();
          end[i] = m->by_use[subsets[i]].end();
        }
        for (;;) {
          int pick = -1;
          for (int i = 0; i < n; ++i)
            if (it[i] != end[i] && (pick < 0 || it[i]->first < it[pick]->first)) pick = i;
          if (pick < 0) break;
          if (!visit({it[pick]->second, tier})) return;
          ++it[pick];
        }
      } else {
        // created descending over the subsets of this tier.
        using It = std::map<uint64_t, Pin*>::const_reverse_iterator;
        It it[2], end[2];
        for (int i = 0; i < n; ++i) {
          it[i] = m->by_created[subsets[i]].rbegin();
          end[i] = m->by_created[subsets[i]].rend();
        }
        for (;;) {
          int pick = -1;
          for (int i = 0; i < n; ++i)
            if (it[i] != end[i] && (pick < 0 || it[i]->first > it[pick]->first)) pick = i;
          if (pick < 0) break;
          if (!visit({it[pick]->second, tier})) return;
          ++it[pick];
        }
      }
    }
  }
}

}  // namespace pins
