#include "csrc/balancer/trace.h"

#include <algorithm>

namespace pins {
namespace {

// Note [Trace memory]: a hash container's bytes, by its size: the bucket array
// and a node (the value and two pointers' worth of link and hash) an entry.
template <typename Hash>
size_t hash_bytes(const Hash& h) {
  // One bucket is the container's own (libstdc++ allocates none for it).
  const size_t buckets = h.bucket_count() > 1 ? h.bucket_count() : 0;
  return buckets * sizeof(void*) + h.size() * (sizeof(typename Hash::value_type) + 2 * sizeof(void*));
}

}  // namespace

size_t TraceRecorder::first_followed() const {
  size_t first = 0;
  while (first < records_.size() && records_[first].departed) ++first;
  return first;
}

size_t TraceRecorder::context_choice(size_t first) const {
  if (first == records_.size()) return first;
  // Note [Trace context]: a rerun (first == 0) takes an older record only when
  // what came after it repeats in the records.
  for (size_t i = first; i < records_.size(); ++i)
    if (!records_[i].departed && records_[i].context && (first > 0 || i == 0 || records_[i].next_repeats)) return i;
  // Past a switch with no record of the same one, the record that came first
  // in its streak, as this prompt does.
  if (first > 0 && !records_[first].with_last)
    for (size_t i = first; i < records_.size(); ++i)
      if (!records_[i].departed && !records_[i].again) return i;
  return first;
}

size_t TraceRecorder::active() const {
  const size_t first = first_followed();
  if (first == records_.size()) return first;
  return context_check_.applies(kAnyModel) ? context_choice(first) : first;
}

void TraceRecorder::record(const TraceKey& k, std::vector<TraceKey>* moved) {
  // A prompt longer than the limit (or a process that never ends one) keeps no
  // record, so memory stays bounded: past it, nothing more until the boundary.
  if (!overflow_ && now_.size() < kLimit) {
    Seen& seen = now_first_.try_emplace(k, Seen{static_cast<uint32_t>(now_.size()), 0}).first->second;
    seen.count++;
    find_conditioning(k, seen);
    now_.push_back(k);
  } else if (!overflow_) {
    overflow_ = true;
    clear_now(/*release=*/true);
    generation_++;  // a rerun's class 1 ranks came from now_first_
  }
  if (departed_) return;
  const size_t was_active = active();
  bool following = false, reported = false;
  const size_t report = was_active < records_.size() ? leader(was_active) : records_.size();
  for (size_t i = 0; i < records_.size(); ++i) {
    Record& rec = records_[i];
    if (rec.departed) continue;
    if (rec.twin != 0) continue;  // moves with its twin, below (Note [Trace memory])
    const size_t window = std::max<size_t>(64, rec.keys.size() / 50);
    bool found = false;
    if (auto it = rec.pos.find(k); it != rec.pos.end()) {
      auto pos = std::lower_bound(it->second.begin(), it->second.end(), static_cast<uint32_t>(rec.cursor));
      if (pos != it->second.end() && *pos - rec.cursor <= window) {
        // Note [Trace index]: the keys whose positions the active cursor passes.
        // They end with `k` itself.
        if (i == report && moved != nullptr) {
          moved->insert(moved->end(), rec.keys.begin() + static_cast<std::ptrdiff_t>(rec.cursor),
                        rec.keys.begin() + static_cast<std::ptrdiff_t>(*pos) + 1);
          reported = true;
        }
        rec.cursor = *pos + 1;
        found = true;
      }
    }
    // A patch set that changed (a LoRA swap) leaves the weights' order as it was.
    if (!found && k.kind != Kind::Patches) rec.departed = true;
    following |= !rec.departed;
  }
  for (size_t i = 0; i < records_.size(); ++i) {
    Record& rec = records_[i];
    if (rec.twin == 0 || rec.departed) continue;
    rec.cursor = records_[leader(i)].cursor;
    rec.departed = records_[leader(i)].departed;
  }
  if (moved != nullptr && !reported) moved->push_back(k);  // its first use in this prompt may be new
  settle(was_active, following);
}

void TraceRecorder::settle(size_t was_active, bool following) {
  if (active() != was_active) generation_++;
  if (!following) {
    departed_ = true;
    departures_++;
  }
}

void TraceRecorder::find_conditioning(const TraceKey& k, const Seen& seen) {
  if (!looped_ && seen.count == kLoopPasses) {
    // The loop starts at the key's first access: the models of the accesses
    // before it that no access since has. Once a prompt, from now_ itself.
    looped_ = true;
    for (uint32_t i = 0; i < seen.first; ++i) conditioning_.insert(now_[i].model);
    for (size_t i = seen.first; i < now_.size(); ++i) conditioning_.erase(now_[i].model);
    if (!conditioning_.empty()) generation_++;
  }
  if (!conditioning_.empty() && conditioning_.erase(k.model) != 0) generation_++;  // it runs after the loop too
}

void TraceRecorder::clear_now(bool release) {
  if (release) {
    // Swapped out, not assigned `{}`: that is the initializer-list assignment,
    // which keeps the capacity (a prompt past kLimit held its 2^20 accesses'
    // 40 MiB until the process ended; Note [Trace memory]).
    std::vector<TraceKey>().swap(now_);
    decltype(now_first_)().swap(now_first_);
  }
  now_.clear();
  now_first_.clear();
  conditioning_.clear();
  looped_ = false;
}

void TraceRecorder::end_prompt() {
  if (overflow_) {
    overflow_ = false;
    clear_now(/*release=*/true);
  } else if (!now_.empty()) {
    Record rec;
    rec.keys = std::move(now_);
    rec.keys.shrink_to_fit();  // kept for kRecords prompts: no growth slack (Note [Trace memory])
    for (uint32_t i = 0; i < rec.keys.size(); ++i) rec.pos[rec.keys[i]].push_back(i);
    for (const TraceKey& k : rec.keys) rec.models.insert(k.model);
    for (const auto& [k, seen] : now_first_)
      if (seen.count >= kLoopPasses) rec.samplers.insert(k.model);
    // Note [Rule checks]: this prompt judges the rules' earlier predictions.
    static const std::unordered_set<ModelId> kNone;
    conditioning_check_.end_prompt(looped_ ? conditioning_ : kNone, rec.models, rec.samplers);
    rec.looped = !rec.samplers.empty();
    if (looped_) rec.conditioning = conditioning_;
    if (rec.samplers.empty()) rec.samplers = rec.models;
    first_seen_.end_prompt(rec.models, rec.samplers);
    // Note [Trace context]: the choice (made or not) is judged by this prompt,
    // and the next one's is noted as this one ends.
    if (!context_said_.empty() && context_said_ != plain_said_) {
      const bool context_right = rec.models == context_said_, plain_right = rec.models == plain_said_;
      if (context_right != plain_right) context_check_.judge(kAnyModel, context_right);
    }
    const size_t first = first_followed(), chosen = context_choice(first);
    context_said_.clear();
    plain_said_.clear();
    if (chosen != first) {
      context_said_ = records_[chosen - 1].models;
      // A rerun's plain prediction is the prompt itself (rank(), a == 0).
      plain_said_ = first > 0 ? records_[first - 1].models : rec.models;
    }
    if (!records_.empty()) rec.before = records_.front().models;
    rec.again = !records_.empty() && same_workflow(rec, records_.front());
    for (ModelId m : rec.models) rec.detour |= !records_.empty() && !knows_model(m);
    rec.bytes = rec.keys.capacity() * sizeof(TraceKey) + hash_bytes(rec.pos) + hash_bytes(rec.models) +
                hash_bytes(rec.samplers) + hash_bytes(rec.conditioning) + hash_bytes(rec.before);
    for (const auto& [k, at] : rec.pos) rec.bytes += at.capacity() * sizeof(uint32_t);
    records_.push_front(std::move(rec));
    if (records_.size() > kRecords) records_.pop_back();
    // Note [Trace memory]: an older record with the same accesses as this one
    // follows a prompt exactly as it does, so it moves with it and costs a
    // cast no lookup of its own. (Its twin is newer: it is dropped first.)
    const std::vector<TraceKey>& keys = records_.front().keys;
    for (size_t i = 1; i < records_.size(); ++i)
      if (records_[i].keys == keys) records_[i].twin = i;
    // Which records followed what the prompt just before the next one (this
    // one) ran.
    for (Record& r : records_) {
      r.context = !r.before.empty() && r.before == records_.front().models;
      r.with_last = same_workflow(r, records_.front());
      r.once = r.detour && std::none_of(records_.begin(), records_.end(), [&](const Record& o) {
                 return &o != &r && same_workflow(o, r);
               });
    }
    count_streaks();
    for (size_t i = 1; i < records_.size(); ++i) {
      const auto& next = records_[i - 1].models;
      records_[i].next_repeats =
          std::count_if(records_.begin(), records_.end(), [&](const Record& r) { return r.models == next; }) >= 2;
    }
    clear_now(/*release=*/false);
  } else if (!records_.empty() && meets(records_.front().samplers, marked_)) {
    // Nothing accessed: the marked models stayed on the device (streaks_go_on()).
    records_.front().went_on = true;
    count_streaks();
  }
  for (Record& rec : records_) {
    rec.cursor = 0;
    rec.departed = false;
  }
  departed_ = records_.empty();
  marked_.clear();
  marked_first_ = false;
  generation_++;
}

void TraceRecorder::count_streaks() {
  // A streak longer than the kept records: the oldest one continued its
  // workflow, whose first record is gone (Note [Trace memory]).
  int went_on = !records_.empty() && records_.back().again ? 1 : 0, switched = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    if (records_[i].again) continue;
    if (records_[i].went_on || (i > 0 && records_[i - 1].again)) {
      went_on++;
    } else if (i > 0) {
      switched++;
    }
  }
  streaks_go_on_ = went_on > switched;
}

size_t TraceRecorder::bytes() const {
  size_t n = now_.capacity() * sizeof(TraceKey) + hash_bytes(now_first_);
  for (const Record& r : records_) n += r.bytes;
  return n;
}

bool TraceRecorder::knows_model(ModelId m) const {
  for (const Record& r : records_)
    if (r.models.count(m) != 0) return true;
  return false;
}

void TraceRecorder::mark(const std::vector<ModelId>& models) {
  bool added = false;
  for (ModelId m : models) added |= marked_.insert(m).second;
  if (departed_) return;
  // Note [Trace marks]: a conditioning model marked now runs in this prompt after all.
  if (marked_first_ && added) generation_++;
  // Only once the marks name a sampler of a followed record.
  bool named = false;
  for (const Record& r : records_) named |= !r.departed && r.looped && meets(r.samplers, marked_);
  if (!named) return;
  if (now_.empty() && !overflow_ && !marked_first_) {
    marked_first_ = true;
    generation_++;
  }
  const size_t was_active = active();
  bool following = false;
  for (Record& r : records_) {
    if (!r.departed && !meets(r.samplers, marked_)) r.departed = true;
    following |= !r.departed;
  }
  settle(was_active, following);
}

void TraceRecorder::depart() {
  departed_ = true;
  generation_++;
}

TraceRecorder::Rank TraceRecorder::rank(const TraceKey& k) const {
  const size_t a = active();
  if (a == records_.size()) return {2, 0};
  const Record& ref = records_[a];
  const auto it = ref.pos.find(k);
  // Note [Trace marks]: the record's conditioning, unmarked, does not run in this prompt.
  const bool unmarked = marked_first_ && ref.conditioning.count(k.model) != 0 && marked_.count(k.model) == 0;
  if (it != ref.pos.end() && !unmarked) {
    auto pos = std::lower_bound(it->second.begin(), it->second.end(), static_cast<uint32_t>(ref.cursor));
    if (pos != it->second.end()) return {0, *pos};
  }
  // Not used again in this prompt: the prompts that followed the active record
  // last time come again in their order, then the active one's workflow
  // (Note [Trace policy]).
  if (a == 0) {
    // Note [Cached conditioning]: the next rerun takes the conditioning from the
    // application's cache; the one after it runs it again.
    if (auto f = now_first_.find(k); f != now_first_.end())
      return {1, (defers_conditioning(k.model) ? ref.keys.size() : 0) + f->second.first};
    if (it != ref.pos.end()) return {1, ref.keys.size() + it->second.front()};
    for (size_t j = 1; j < records_.size(); ++j)
      if (auto o = records_[j].pos.find(k); o != records_[j].pos.end()) return {1, ref.keys.size() + o->second.front()};
    return {2, 0};
  }
  uint64_t offset = 0;
  for (size_t j = a; j-- > 0;) {
    const Record& later = records_[j];
    // Where the user's workflows go on in streaks, a one-off is not predicted
    // to come round again (Note [Trace policy]).
    if (later.once && streaks_go_on_) continue;
    if (auto n = later.pos.find(k); n != later.pos.end()) return {1, offset + n->second.front()};
    offset += later.keys.size();
  }
  if (it != ref.pos.end()) return {1, offset + it->second.front()};
  return {2, 0};
}

uint64_t TraceRecorder::next_use(const TraceKey& k) const {
  const Rank r = rank(k);
  if (r.cls == 2) return kNever;
  const Record& ref = records_[active()];
  const uint64_t cursor = std::min(ref.cursor, ref.keys.size());
  if (r.cls == 0) return r.value - cursor;
  return ref.keys.size() - cursor + r.value;
}

TraceKey trace_key(const Pin& p) { return {p.model, is_patch(p.subset) ? Kind::Patches : Kind::Weights, p.key}; }

Model::TraceIndexKey trace_index_key(const Pin& p) { return {p.trace_cls, p.trace_value, p.bytes, p.created}; }

Model::TraceIndexKey rank_pin(Pin& p, const TraceRecorder& trace) {
  const TraceRecorder::Rank r = trace.rank(trace_key(p));
  p.trace_cls = r.cls;
  p.trace_value = r.value;
  p.trace_indexed = true;
  return trace_index_key(p);
}

void trace_index(Model& m, Pin* p, const TraceRecorder& trace) {
  m.by_trace[static_cast<int>(p->subset)].emplace(rank_pin(*p, trace), p);
}

void trace_unindex(Model& m, Pin* p) {
  if (!p->trace_indexed) return;
  m.by_trace[static_cast<int>(p->subset)].erase(trace_index_key(*p));
  p->trace_indexed = false;
}

}  // namespace pins
