#include "csrc/balancer/eviction.h"

#include <algorithm>
#include <iterator>
#include <tuple>

namespace pins {

namespace {

// Note [Reuse policy]: ties on the order key go to the larger prediction, the
// later use, the larger pin, the newer pin.
using ReuseRank = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>;
ReuseRank reuse_rank(const ReuseHistory& h, const Pin& p, bool in_prompt, uint64_t now) {
  return {h.order_key(p, in_prompt, now), h.prediction(p, now), p.last_use, p.bytes, p.created};
}

// A run of one index read backwards, from one past its head (`it`) down to
// `begin`, whose pins are all of one tier.
template <typename It>
struct Stream {
  It begin, it;
  int tier;
  bool in_prompt;
};

// Visits the union of `streams`, the largest rank_of(stream, head) first, until
// `visit` returns false (then false). O(streams) per candidate.
template <typename It, typename RankOf>
bool visit_merged(std::vector<Stream<It>>& streams, RankOf rank_of,
                  const std::function<bool(const Candidate&)>& visit) {
  using Rank = decltype(rank_of(streams.front(), streams.front().it));
  std::vector<Rank> head(streams.size());
  for (size_t i = 0; i < streams.size(); ++i)
    if (streams[i].it != streams[i].begin) head[i] = rank_of(streams[i], std::prev(streams[i].it));
  for (;;) {
    int pick = -1;
    for (int i = 0; i < static_cast<int>(streams.size()); ++i)
      if (streams[i].it != streams[i].begin && (pick < 0 || head[i] > head[pick])) pick = i;
    if (pick < 0) return true;
    Stream<It>& st = streams[pick];
    --st.it;
    if (!visit({st.it->second, st.tier})) return false;
    if (st.it != st.begin) head[pick] = rank_of(st, std::prev(st.it));
  }
}

// Tiers 1-4 merged, then tier 5 when the reach allows: add(model, subset,
// tier, streams) adds the streams of each subset within the reach, and they
// are visited by visit_merged() in the order of rank_of.
template <typename It, typename Add, typename RankOf>
void walk_merged_tiers(const Models& models, Reach reach, unsigned subsets, Add add, RankOf rank_of,
                       const std::function<bool(const Candidate&)>& visit, Spare spare) {
  for (const bool last : {false, true}) {
    if (last && last_tier(reach) < 5) return;
    std::vector<Stream<It>> streams;
    for (const auto& [id, m] : models)
      for (int s = 0; s < kSubsets; ++s) {
        if (!(subsets & subset_bit(static_cast<Subset>(s))) || spare.covers(id, static_cast<Subset>(s))) continue;
        const int tier = tier_of(static_cast<Subset>(s), *m);
        if ((tier == 5) == last && tier <= last_tier(reach)) add(*m, s, tier, streams);
      }
    if (!visit_merged(streams, rank_of, visit)) return;
  }
}

// Note [Reuse policy]: the order of eviction_order() from the models' by_reuse
// indexes. Within a subset's group of one gap, the pins of each stage are a
// range of last uses (cut at failed_before()), ordered as the policy orders
// them when read backwards, whatever the prompt length and the clamp; the walk
// merges the ranges' heads.
void walk_reuse_order(const Models& models, Reach reach, unsigned subsets, const ReuseHistory& history,
                      uint64_t now, const std::function<bool(const Candidate&)>& visit, Spare spare) {
  using It = std::map<Model::ReuseKey, Pin*>::const_iterator;
  const auto add = [&](const Model& m, int s, int tier, std::vector<Stream<It>>& streams) {
    const auto& index = m.by_reuse[s];
    for (It g = index.begin(); g != index.end();) {
      const uint64_t gap = std::get<0>(g->first);
      const It group_end = index.lower_bound({gap + 1, 0, 0, 0});
      // Stage k holds the uses in [failed_before(k), failed_before(k - 1)); never the rest.
      It hi = group_end;
      for (int stage = 0; stage < ReuseHistory::kStages; ++stage) {
        const It lo = index.lower_bound({gap, history.failed_before(gap, stage, now), 0, 0});
        if (lo != hi) streams.push_back({lo, hi, tier, tier > 2});
        hi = lo;
      }
      if (g != hi) streams.push_back({g, hi, tier, tier > 2});
      g = group_end;
    }
  };
  const auto rank_of = [&](const Stream<It>& st, It head) {
    return reuse_rank(history, *head->second, st.in_prompt, now);
  };
  walk_merged_tiers<It>(models, reach, subsets, add, rank_of, visit, spare);
}

// Note [Trace index]: the order of eviction_order() while the trace policy
// follows a record, from the models' by_trace indexes, each read backwards
// (farthest next use first).
void walk_trace_order(const Models& models, Reach reach, unsigned subsets,
                      const std::function<bool(const Candidate&)>& visit, Spare spare) {
  using It = std::map<Model::TraceIndexKey, Pin*>::const_iterator;
  const auto add = [](const Model& m, int s, int tier, std::vector<Stream<It>>& streams) {
    if (!m.by_trace[s].empty()) streams.push_back({m.by_trace[s].begin(), m.by_trace[s].end(), tier, tier > 2});
  };
  walk_merged_tiers<It>(models, reach, subsets, add, [](const Stream<It>&, It head) { return head->first; },
                        visit, spare);
}

}  // namespace

int tier_of(Subset s, const Model& m) {
  const bool in_prompt = m.in_prompt || m.active;
  const bool streaming = is_streaming(s);
  if (!in_prompt) return streaming ? 1 : 2;
  if (!streaming) return 3;
  return m.active ? 5 : 4;
}

int tier_of(const Pin& p, const Model& m) { return tier_of(p.subset, m); }

std::vector<Candidate> eviction_order(const Models& models, Reach reach, PolicyKind policy,
                                      const TraceRecorder& trace, const ReuseView& reuse, unsigned subsets) {
  struct Row {
    Candidate c;
    const Model* m;
    uint64_t next_use;
  };
  std::vector<Row> rows;
  for (const auto& [id, m] : models)
    for (int s = 0; s < kSubsets; ++s)
      for (const auto& [created, p] : m->by_created[s]) {
        if (!(subsets & subset_bit(p->subset))) break;  // a subset left out: all its pins
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
    // Note [Reuse policy]: the largest order key first.
    std::vector<std::pair<ReuseRank, Row>> ranked;
    for (const Row& r : rows) ranked.emplace_back(reuse_rank(*reuse.history, *r.c.pin, r.c.tier > 2, reuse.now), r);
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      if ((a.second.c.tier == 5) != (b.second.c.tier == 5)) return b.second.c.tier == 5;  // active streaming pins last
      return a.first > b.first;
    });
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = ranked[i].second;
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
                         const std::function<bool(const Candidate&)>& visit, const ReuseView& reuse,
                         unsigned subsets, Spare spare) {
  if (policy == PolicyKind::Reuse && reuse.history != nullptr && !reuse.history->clairvoyant()) {
    walk_reuse_order(models, reach, subsets, *reuse.history, reuse.now, visit, spare);
    return;
  }
  if (policy == PolicyKind::Trace && trace.following()) {
    walk_trace_order(models, reach, subsets, visit, spare);
    return;
  }
  if (policy == PolicyKind::Reuse && reuse.history) {
    // Reuse's clairvoyant variant (the simulator's): its predictions move with
    // every access, and no index keeps them (Note [Eviction walk]).
    for (const Candidate& c : eviction_order(models, reach, policy, trace, reuse, subsets))
      if (!spare.covers(c.pin->model, c.pin->subset) && !visit(c)) return;
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
      int picked[2], n = 0;
      for (int s = 0; s < kSubsets; ++s)
        if ((subsets & subset_bit(static_cast<Subset>(s))) && !spare.covers(m->id, static_cast<Subset>(s)) &&
            tier_of(static_cast<Subset>(s), *m) == tier)
          picked[n++] = s;
      if (n == 0) continue;
      if (lru) {
        // (last_use, created) ascending over the subsets of this tier.
        using It = std::map<std::pair<uint64_t, uint64_t>, Pin*>::const_iterator;
        It it[2], end[2];
        for (int i = 0; i < n; ++i) {
          it[i] = m->by_use[picked[i]].begin();
          end[i] = m->by_use[picked[i]].end();
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
          it[i] = m->by_created[picked[i]].rbegin();
          end[i] = m->by_created[picked[i]].rend();
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
