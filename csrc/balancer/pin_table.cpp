#include "csrc/balancer/pin_table.h"

#include <algorithm>

#include "csrc/base/check.h"

namespace pins {

PinTable::PinTable(PolicyKind policy) : policy_(policy), reuse_on_(policy == PolicyKind::Reuse) {}

// ------------------------------------------------------------------ models

ModelId PinTable::add_model(std::string name, std::string load_device, ModelOptions options) {
  auto m = std::make_unique<Model>();
  m->id = next_model_++;
  m->name = std::move(name);
  m->load_device = std::move(load_device);
  m->options = options;
  m->load_seq = ++seq_;
  const ModelId id = m->id;
  models_.emplace(id, std::move(m));
  return id;
}

Model& PinTable::model(ModelId id, const char* what) {
  auto it = models_.find(id);
  PINS_CHECK_VALUE(it != models_.end(), what, ": model ", id, " is not registered");
  return *it->second;
}

const Model& PinTable::model(ModelId id, const char* what) const {
  auto it = models_.find(id);
  PINS_CHECK_VALUE(it != models_.end(), what, ": model ", id, " is not registered");
  return *it->second;
}

Model* PinTable::find_model(ModelId id) {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
}

void PinTable::forget_model(ModelId id, std::vector<void*>& to_free) {
  Model& m = *models_.at(id);
  for (int s = 0; s < kSubsets; ++s) drop_if(m, static_cast<Subset>(s), [](const Pin&) { return true; }, to_free);
  // Lifetime totals never decrease: its COUNTs and SUMs stay in them. Its
  // levels are 0 now (held pins were detached and left them).
  for (int s = 0; s < kSubsets; ++s) {
    PINS_ASSERT(m.stats[s].pins == 0 && m.stats[s].bytes == 0);
    retired_[s] += m.stats[s];
  }
  models_.erase(id);
  trace_.forget(id);  // Note [Rule checks]
}

void PinTable::set_active(Model& m, bool active) {
  if (active && !m.active) m.load_seq = ++seq_;
  m.active = active;
}

// ------------------------------------------------------------------ pins

Pin* PinTable::lookup(Model& m, Subset s, const Request& r, std::vector<void*>& to_free) {
  auto it = m.pins[static_cast<int>(s)].find(r.key);
  if (it == m.pins[static_cast<int>(s)].end()) return nullptr;
  Pin* p = it->second.get();
  if (p->state == PinState::Evicting) return p;
  // Note [Pin validity]. A gathered pin's parts also tell apart two groups
  // whose keys collide: the other group is re-pinned, never served.
  const bool stale = p->version != r.version || p->signature != r.signature || p->parts != r.parts ||
                     (p->guard && !p->guard->alive());
  if (!stale) return p;
  m.stats[static_cast<int>(s)].dropped++;
  unlink(p, to_free);
  return nullptr;
}

bool PinTable::holds(const Model& m, Kind kind, const PinKey& key) const {
  return m.pins[static_cast<int>(streaming_subset(kind))].count(key) != 0 ||
         m.pins[static_cast<int>(cache_subset(kind))].count(key) != 0;
}

void PinTable::touch(Model& m, Pin* p, uint64_t reuse_gap) {
  // Note [Eviction walk]: by_use moves with last_use (the node is reused).
  auto& by_use = m.by_use[static_cast<int>(p->subset)];
  auto node = by_use.extract({p->last_use, p->created});
  if (reuse_on_) reuse_unindex(m, p);
  p->last_use = clock_;
  node.key() = {p->last_use, p->created};
  by_use.insert(std::move(node));
  p->reuse_gap = reuse_gap;
  if (reuse_on_) reuse_index(m, p);
}

Pin* PinTable::create(Model& m, const Request& r, Subset target, void* block, uint64_t reuse_gap,
                      std::unique_ptr<SourceGuard> guard) {
  auto pin = std::make_unique<Pin>();
  Pin* p = pin.get();
  p->key = r.key;
  p->subset = target;
  p->model = r.model;
  p->bytes = r.bytes;
  p->block = block;
  p->created = ++seq_;
  p->last_use = clock_;
  p->reuse_gap = reuse_gap;
  p->signature = r.signature;
  p->version = r.version;
  p->span = r.span;
  p->parts = r.parts;
  p->guard = std::move(guard);
  p->state = PinState::Filling;
  p->users = 1;
  link(m, std::move(pin));
  return p;
}

void PinTable::link(Model& m, std::unique_ptr<Pin> pin) {
  Pin* p = pin.get();
  const int s = static_cast<int>(p->subset);
  m.pins[s].emplace(p->key, std::move(pin));
  m.by_created[s].emplace(p->created, p);
  m.by_use[s].emplace(std::make_pair(p->last_use, p->created), p);
  if (reuse_on_) reuse_index(m, p);
  if (trace_index_current()) trace_index(m, p, trace_);
  sources_.add(p);
  ring_.add(p);
  m.stats[s].pins++;
  m.stats[s].bytes += static_cast<int64_t>(p->bytes);
  m.stats[s].created++;
  if (m.in_prompt) m.prompt_peak = std::max(m.prompt_peak, held_bytes(m));  // Note [Prewarm]
}

void PinTable::unlink(Pin* p, std::vector<void*>& to_free) {
  Model& m = *models_.at(p->model);
  const int s = static_cast<int>(p->subset);
  auto it = m.pins[s].find(p->key);
  PINS_ASSERT(it != m.pins[s].end() && it->second.get() == p);
  std::unique_ptr<Pin> owned = std::move(it->second);
  m.pins[s].erase(it);
  m.by_created[s].erase(p->created);
  m.by_use[s].erase({p->last_use, p->created});
  if (reuse_on_) reuse_unindex(m, p);
  trace_unindex(m, p);
  sources_.remove(p);
  ring_.remove(p);
  m.stats[s].pins--;
  m.stats[s].bytes -= static_cast<int64_t>(p->bytes);
  if (p->users > 0 || p->state == PinState::Evicting) {
    // Someone still holds it: it is freed when they let go.
    p->orphaned = true;
    orphans_.emplace(p, std::move(owned));
  } else if (p->block != nullptr) {
    to_free.push_back(p->block);
  }
}

void PinTable::reap_orphan(Pin* p, std::vector<void*>& to_free) {
  to_free.push_back(p->block);
  orphans_.erase(p);  // destroys p
}

size_t PinTable::drop_if(Model& m, Subset s, const std::function<bool(const Pin&)>& pred,
                         std::vector<void*>& to_free, bool invalidated) {
  std::vector<Pin*> doomed;  // collected first: unlinking erases from the map being walked
  for (auto& [key, p] : m.pins[static_cast<int>(s)])
    if (pred(*p)) doomed.push_back(p.get());
  size_t bytes = 0;
  for (Pin* p : doomed) {
    m.stats[static_cast<int>(s)].dropped++;
    if (invalidated) m.stats[static_cast<int>(s)].invalidated++;
    bytes += p->bytes;
    unlink(p, to_free);
  }
  return bytes;
}

size_t PinTable::drop_overlapping(uint64_t storage, uint64_t begin, uint64_t end, std::vector<void*>& to_free) {
  size_t bytes = 0;
  for (Pin* p : sources_.overlapping(storage, begin, end)) {
    // Whatever its state: a pin being filled, evicted or page-unlocked is
    // detached (orphaned) by unlink and never served again.
    SubsetStats& st = stats_of(*p);
    st.dropped++;
    st.invalidated++;
    bytes += p->bytes;
    unlink(p, to_free);
  }
  return bytes;
}

size_t PinTable::reclaim(size_t checks, std::vector<void*>& to_free) {
  size_t bytes = 0;
  ring_.step(checks, [&](Pin* p) {
    if (p->state != PinState::Live || !p->guard || p->guard->alive()) return false;
    stats_of(*p).dropped++;
    bytes += p->bytes;
    unlink(p, to_free);  // the next unchecked pin takes its slot
    return true;
  });
  return bytes;
}

void PinTable::release_all(std::vector<void*>& to_free) {
  for (auto& [id, m] : models_)
    for (auto& subset : m->pins)
      for (auto& [key, p] : subset) to_free.push_back(p->block);
  for (auto& [p, owned] : orphans_) to_free.push_back(owned->block);
  models_.clear();
  orphans_.clear();
  sources_ = SourceIndex();
  ring_ = ReclaimRing();
}

// ------------------------------------------------------------------ counters

void PinTable::bypass(ModelId model, Bypass why) {
  const int i = static_cast<int>(why);
  bypassed_[i]++;
  const bool refusal = why == Bypass::Refused || why == Bypass::Pool;
  if (refusal) refusals_++;
  if (auto it = models_.find(model); it != models_.end()) {
    it->second->bypassed[i]++;
    if (refusal) it->second->refusals++;
  }
}

void PinTable::collect(BalancerStats& out) const {
  out.models.reserve(models_.size());
  for (const auto& [id, m] : models_) {
    ModelStats ms;
    ms.id = id;
    ms.name = m->name;
    ms.load_device = m->load_device;
    ms.options = m->options;
    for (int b = 0; b < kBypassReasons; ++b) ms.bypassed[b] = m->bypassed[b];
    for (int s = 0; s < kSubsets; ++s) {
      ms.subsets[s] = m->stats[s];
      ms.total += m->stats[s];
      out.subsets[s] += m->stats[s];
    }
    ms.refusals = m->refusals;
    ms.active = m->active;
    ms.in_prompt = m->in_prompt;
    if (m->on_device) ms.device_bytes = static_cast<int64_t>(m->on_device->bytes);
    out.total += ms.total;
    out.models.push_back(std::move(ms));
  }
  for (int s = 0; s < kSubsets; ++s) {  // forgotten models' COUNTs and SUMs (levels 0)
    out.subsets[s] += retired_[s];
    out.total += retired_[s];
  }
  out.refusals = refusals_;
  out.busy_misses = busy_misses_;
  for (int b = 0; b < kBypassReasons; ++b) out.bypassed[b] = bypassed_[b];
  out.trace_departures = trace_.departures();
  out.rule_first_seen_wrong = trace_.first_seen().check().wrong_verdicts();
  out.rule_first_seen_right = trace_.first_seen().check().right_verdicts();
  out.rule_conditioning_wrong = trace_.conditioning_check().check().wrong_verdicts();
  out.rule_conditioning_right = trace_.conditioning_check().check().right_verdicts();
  out.trace_records = static_cast<int64_t>(trace_.records());
  out.trace_bytes = static_cast<int64_t>(trace_.bytes());
  out.reuse_keys = static_cast<int64_t>(reuse_.keys());
}

}  // namespace pins
