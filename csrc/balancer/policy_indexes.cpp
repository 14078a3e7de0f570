// The pin table's policy side: what the trace and reuse policies record of each
// access, and the indexes of the eviction order they keep current (Note
// [Eviction walk] in eviction.h, Note [Trace index] in trace.h, Note [Reuse
// policy] in reuse.h).
#include <algorithm>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "csrc/balancer/pin_table.h"

namespace pins {

void PinTable::set_policy(PolicyKind policy) {
  if (policy != policy_) trace_.depart();  // the cursors did not follow this prompt
  policy_ = policy;
  set_reuse_indexes(policy_ == PolicyKind::Reuse);
  if (policy_ != PolicyKind::Trace) clear_trace_index();
}

uint64_t PinTable::record_access(Model& m, const Request& r) {
  if (policy_ == PolicyKind::Trace) {
    // Note [Trace index]: the pins whose rank this access moves, when the
    // indexes are kept and the active record stays.
    const bool indexed = trace_index_current();
    trace_moved_.clear();
    trace_.record({r.model, r.kind, r.key}, indexed ? &trace_moved_ : nullptr);
    if (indexed && trace_index_current()) retrace(trace_moved_);
  }
  m.last_use = ++clock_;
  return policy_ == PolicyKind::Reuse ? reuse_.record({r.model, r.kind, r.key}) : 0;
}

void PinTable::end_prompt() {
  trace_.end_prompt();  // Note [Trace policy]: this prompt's record becomes the reference
  reuse_.end_prompt(clock_);
  for (auto& [id, m] : models_)
    if (m->in_prompt || m->active) m->idle_through = prompt_start_;  // Note [Idle cache pins]
}

void PinTable::walk(Reach reach, const std::function<bool(const Candidate&)>& visit, const Asker& asker) {
  // Note [Trace index]: the first decision of a generation ranks every pin again.
  if (policy_ == PolicyKind::Trace && trace_.following() && !trace_index_current()) rebuild_trace_index();
  const bool for_patch = asker.target && is_patch(*asker.target);
  const bool for_cache = asker.target && !is_streaming(*asker.target);
  const auto own = [&](const Pin& p) { return for_cache && p.model == asker.model && p.subset == *asker.target; };
  // Note [Idle cache pins]: first, each model's cache pins unused through its
  // last prompt, unless the trace's prediction ranks them.
  std::unordered_set<const Pin*> idle;  // visited here, skipped below
  const bool predicted = policy_ == PolicyKind::Trace && trace_.following();
  for (auto& [id, m] : models_) {
    if (!m->idle_through || predicted) continue;
    for (const Subset s : {Subset::WeightsLoaded, Subset::PatchesLoaded}) {
      if (for_patch && !is_patch(s)) continue;
      const auto& by_use = m->by_use[static_cast<int>(s)];
      for (auto it = by_use.begin(); it != by_use.end() && it->first.first <= *m->idle_through; ++it) {
        if (own(*it->second)) break;  // a model's own pins are not taken for its own new pin
        idle.insert(it->second);
        if (!visit({it->second, tier_of(*it->second, *m)})) return;
      }
    }
  }
  // Note [Trace bypass]: a new weight pin takes no weight pin the trace
  // predicts to be used no later than its own source; the walk (farthest first)
  // stops at the first such pin, and the new pin is refused unless enough was
  // freed before it.
  const bool bypass = policy_ == PolicyKind::Trace && trace_.following() && asker.key != nullptr && asker.target &&
                      !for_patch;
  TraceRecorder::Rank mine;
  if (bypass) mine = trace_.rank({asker.model, Kind::Weights, *asker.key});
  const auto sooner = [&](const Pin& p) {
    return bypass && !is_patch(p.subset) && std::tie(p.trace_cls, p.trace_value) <= std::tie(mine.cls, mine.value);
  };
  bool stopped = false;
  const auto rest = [&](const Candidate& c) {
    if (idle.count(c.pin) != 0) return true;
    // Note [Idle cache pins]: a model being loaded does not evict its own
    // layers for others of its own: the new pin is refused. While the trace is
    // followed, the bypass judges those pins like any other (Note [Trace bypass]).
    stopped = (own(*c.pin) && !bypass) || sooner(*c.pin) || !visit(c);
    return !stopped;
  };
  const ReuseView reuse{&reuse_, clock_};
  // Note [Miss cost]: patch pins first (any tier for a new weight pin), then the weights.
  walk_eviction_order(models_, asker.target && !for_patch ? Reach::All : reach, policy_, trace_, rest, reuse,
                      kPatchSubsets);  // Note [Eviction walk]
  if (stopped || for_patch) return;
  // Note [First-seen models]: a loaded layer of a model no record knows takes
  // no weight pin of the user's loop, while the rule's check trusts it (Note
  // [Rule checks]); the check notes the prediction either way.
  Spare spare;
  if (for_cache && policy_ == PolicyKind::Trace && !trace_.knows_model(asker.model)) {
    FirstSeenCheck& check = trace_.first_seen();
    check.note(asker.model, [&] {
      return trace_.last_workflow_models([&](ModelId id) {
        const Model* m = find_model(id);
        return m == nullptr || m->in_prompt || m->active;
      });
    });
    // Before the check's first verdict, the records' streaks decide: where
    // workflows took turns the workflow is spared whole, where they go on its
    // streamed layers are.
    const bool judged = check.check().judged();
    if (judged ? check.applies(asker.model) : !trace_.streaks_go_on()) {
      // The first prompt of all, with no record, spares every pin it made.
      if (trace_.records() == 0) return;
      spare = {check.spared(asker.model), kWeightSubsets};
    } else if (!judged) {
      spare = {check.spared(asker.model), subset_bit(Subset::Weights)};
    }
  }
  if (spare.models != nullptr && (spare.subsets & subset_bit(Subset::WeightsLoaded))) {
    walk_spared_on_device(reach, spare, rest, reuse);
    if (stopped) return;
  }
  walk_eviction_order(models_, reach, policy_, trace_, rest, reuse, kWeightSubsets, spare);
}

// Note [Spared layers on the device]: of each spared model's cache pins, as
// many bytes as are certainly of layers on its device, farthest predicted use
// first. O(models) and a walk of their cache pins, only for a first-seen model's load.
void PinTable::walk_spared_on_device(Reach reach, const Spare& spare,
                                     const std::function<bool(const Candidate&)>& visit, const ReuseView& reuse) {
  std::unordered_map<ModelId, uint64_t> room;
  std::unordered_set<ModelId> others;  // walked here: none of their pins
  uint64_t rooms = 0;
  for (const auto& [id, m] : models_) {
    const uint64_t cached = static_cast<uint64_t>(m->stats[static_cast<int>(Subset::WeightsLoaded)].bytes);
    const uint64_t off = m->on_device ? m->on_device->total - m->on_device->bytes : 0;
    if (spare.covers(id, Subset::WeightsLoaded) && m->on_device && cached > off) {
      room[id] = cached - off;
      rooms += cached - off;
    } else {
      others.insert(id);
    }
  }
  if (rooms == 0) return;
  const auto take = [&](const Candidate& c) {
    uint64_t& left = room[c.pin->model];
    if (left < c.pin->bytes) return true;  // not certainly on the device
    left -= c.pin->bytes;
    rooms -= c.pin->bytes;
    return visit(c) && rooms > 0;
  };
  walk_eviction_order(models_, reach, policy_, trace_, take, reuse, subset_bit(Subset::WeightsLoaded),
                      Spare{&others, kAllSubsets});
}

// ------------------------------------------------------------------ Note [Reuse policy]

void PinTable::reuse_index(Model& m, Pin* p) {
  m.by_reuse[static_cast<int>(p->subset)].emplace(ReuseHistory::index_key(*p), p);
}

void PinTable::reuse_unindex(Model& m, Pin* p) {
  m.by_reuse[static_cast<int>(p->subset)].erase(ReuseHistory::index_key(*p));
}

void PinTable::set_reuse_indexes(bool on) {
  if (on == reuse_on_) return;
  reuse_on_ = on;
  for (auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s) {
      m->by_reuse[s].clear();
      if (on)
        for (auto& [key, p] : m->pins[s]) reuse_index(*m, p.get());
    }
}

// ------------------------------------------------------------------ Note [Trace index]

bool PinTable::trace_index_current() const {
  return policy_ == PolicyKind::Trace && trace_.following() && trace_generation_ == trace_.generation();
}

void PinTable::retrace(const std::vector<TraceKey>& keys) {
  for (const TraceKey& k : keys) {
    Model* m = find_model(k.model);
    if (m == nullptr) continue;
    for (const Subset s : {streaming_subset(k.kind), cache_subset(k.kind)}) {
      auto p = m->pins[static_cast<int>(s)].find(k.key);
      if (p == m->pins[static_cast<int>(s)].end()) continue;
      trace_unindex(*m, p->second.get());
      trace_index(*m, p->second.get(), trace_);
    }
  }
}

void PinTable::rebuild_trace_index() {
  clear_trace_index();
  // Ranked into a sorted run first: a map built from one, each node placed at
  // its end, costs no search (O(n log n) for the sort, once per generation).
  std::vector<std::pair<Model::TraceIndexKey, Pin*>> run;
  for (auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s) {
      run.clear();
      run.reserve(m->pins[s].size());
      for (auto& [key, p] : m->pins[s]) run.emplace_back(rank_pin(*p, trace_), p.get());
      std::sort(run.begin(), run.end());
      for (const auto& [k, p] : run) m->by_trace[s].emplace_hint(m->by_trace[s].end(), k, p);
    }
  trace_generation_ = trace_.generation();
}

void PinTable::clear_trace_index() {
  if (trace_generation_ == kNoTraceIndex) return;
  for (auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s) {
      m->by_trace[s].clear();
      for (auto& [key, p] : m->pins[s]) p->trace_indexed = false;
    }
  trace_generation_ = kNoTraceIndex;
}

std::optional<size_t> PinTable::trace_index_faults() const {
  if (!trace_index_current()) return std::nullopt;
  size_t faults = 0;
  for (const auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s) {
      faults += m->by_trace[s].size() != m->pins[s].size();
      for (const auto& [key, p] : m->pins[s]) {
        const TraceRecorder::Rank r = trace_.rank(trace_key(*p));  // afresh, not the rank p holds
        const auto it = m->by_trace[s].find({r.cls, r.value, p->bytes, p->created});
        faults += it == m->by_trace[s].end() || it->second != p.get();
      }
    }
  return faults;
}

}  // namespace pins
