#include "csrc/balancer/balancer.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "csrc/base/check.h"
#include "csrc/base/nvtx.h"

namespace pins {

const char* to_string(Subset s) {
  switch (s) {
    case Subset::Weights: return "weights";
    case Subset::Patches: return "patches";
    case Subset::WeightsLoaded: return "weights-loaded";
    case Subset::PatchesLoaded: return "patches-loaded";
  }
  return "?";
}

// ------------------------------------------------------------------ Lease

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (pin_ != nullptr) owner_->release(pin_);
    owner_ = o.owner_;
    pin_ = o.pin_;
    hit_ = o.hit_;
    fill_ = o.fill_;
    o.pin_ = nullptr;
  }
  return *this;
}

Lease::~Lease() {
  if (pin_ != nullptr) owner_->release(pin_);
}

void* Lease::data() const { return pin_->block; }
size_t Lease::bytes() const { return pin_->bytes; }
Subset Lease::subset() const { return pin_->subset; }

void Lease::filled() {
  PINS_ASSERT(pin_ != nullptr && fill_, "filled() on a lease that had nothing to fill");
  owner_->mark_filled(pin_);
  fill_ = false;
}

// ------------------------------------------------------------------ Balancer

Balancer::Balancer(const Config& config, HostPool& pool, MemoryProbe& probe)
    : pool_(pool), probe_(probe), config_(config) {}

Balancer::~Balancer() {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [id, m] : models_)
      for (auto& subset : m->pins)
        for (auto& [key, p] : subset) blocks.push_back(p->block);
    for (auto& [p, owned] : orphans_) blocks.push_back(owned->block);
    models_.clear();
    orphans_.clear();
  }
  free_blocks(blocks);
}

void Balancer::configure(const Config& config) {
  std::lock_guard<std::mutex> g(mu_);
  if (config.policy != config_.policy) departed_ = true;  // the cursors did not follow this prompt
  config_ = config;
}

Config Balancer::config() const {
  std::lock_guard<std::mutex> g(mu_);
  return config_;
}

Model& Balancer::model_locked(ModelId id, const char* what) {
  auto it = models_.find(id);
  PINS_CHECK_VALUE(it != models_.end(), what, ": model ", id, " is not registered");
  return *it->second;
}

const Model& Balancer::model_locked(ModelId id, const char* what) const {
  auto it = models_.find(id);
  PINS_CHECK_VALUE(it != models_.end(), what, ": model ", id, " is not registered");
  return *it->second;
}

ModelId Balancer::register_model(std::string name, std::string load_device) {
  std::lock_guard<std::mutex> g(mu_);
  auto m = std::make_unique<Model>();
  m->id = next_model_++;
  m->name = std::move(name);
  m->load_device = std::move(load_device);
  m->load_seq = ++seq_;
  const ModelId id = m->id;
  models_.emplace(id, std::move(m));
  return id;
}

bool Balancer::has_model(ModelId model) const {
  std::lock_guard<std::mutex> g(mu_);
  return models_.count(model) != 0;
}

void Balancer::unlink_locked(Pin* p, std::vector<void*>& to_free) {
  Model& m = *models_.at(p->model);
  const int s = static_cast<int>(p->subset);
  auto it = m.pins[s].find(p->key);
  PINS_ASSERT(it != m.pins[s].end() && it->second.get() == p);
  std::unique_ptr<Pin> owned = std::move(it->second);
  m.pins[s].erase(it);
  m.by_created[s].erase(p->created);
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

void Balancer::free_blocks(const std::vector<void*>& blocks) {
  for (void* b : blocks)
    if (b != nullptr) pool_.free(b);
}

SubsetStats& Balancer::stats_locked(const Pin& p) { return models_.at(p.model)->stats[static_cast<int>(p.subset)]; }

void Balancer::reap_orphan_locked(Pin* p, std::vector<void*>& to_free) {
  to_free.push_back(p->block);
  orphans_.erase(p);  // destroys p
}

void Balancer::refused_locked(ModelId model) {
  refusals_++;
  if (auto it = models_.find(model); it != models_.end()) it->second->refusals++;
}

size_t Balancer::drop_if_locked(Model& m, Subset s, const std::function<bool(const Pin&)>& pred,
                                std::vector<void*>& to_free) {
  std::vector<Pin*> doomed;  // collected first: unlinking erases from the map being walked
  for (auto& [key, p] : m.pins[static_cast<int>(s)])
    if (pred(*p)) doomed.push_back(p.get());
  size_t bytes = 0;
  for (Pin* p : doomed) {
    m.stats[static_cast<int>(s)].dropped++;
    bytes += p->bytes;
    unlink_locked(p, to_free);
  }
  return bytes;
}

void Balancer::forget_model(ModelId model) {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> g(mu_);
    Model& m = model_locked(model, "forget_model");
    for (int s = 0; s < kSubsets; ++s) drop_if_locked(m, static_cast<Subset>(s), [](const Pin&) { return true; }, blocks);
    models_.erase(model);
  }
  free_blocks(blocks);
}

void Balancer::set_active(ModelId model, bool active) {
  std::lock_guard<std::mutex> g(mu_);
  Model& m = model_locked(model, "set_active");
  if (active && !m.active) m.load_seq = ++seq_;
  m.active = active;
}

void Balancer::mark_prompt(const std::vector<ModelId>& models) {
  std::lock_guard<std::mutex> g(mu_);
  for (ModelId id : models) model_locked(id, "mark_prompt");  // all or nothing
  prompt_ = true;
  for (ModelId id : models) models_.at(id)->in_prompt = true;
}

bool Balancer::prompt_running() const {
  std::lock_guard<std::mutex> g(mu_);
  return prompt_;
}

void Balancer::end_prompt() {
  PINS_RANGE("pins::end_prompt");
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> g(mu_);
    prompt_ = false;
    for (auto& [id, m] : models_) {
      m->in_prompt = false;
      drop_if_locked(*m, Subset::Patches, [](const Pin& p) { return p.state != PinState::Evicting; }, blocks);
    }
    // Note [Trace policy]: this prompt's record becomes the reference.
    if (trace_overflow_) {
      trace_overflow_ = false;
      trace_now_ = {};
      trace_now_first_ = {};
    } else if (!trace_now_.empty()) {
      TraceRecord rec;
      rec.keys = std::move(trace_now_);
      for (uint32_t i = 0; i < rec.keys.size(); ++i) rec.pos[rec.keys[i]].push_back(i);
      trace_records_.push_front(std::move(rec));
      if (trace_records_.size() > kTraceRecords) trace_records_.pop_back();
      trace_now_.clear();
      trace_now_first_.clear();
    }
    for (TraceRecord& rec : trace_records_) {
      rec.cursor = 0;
      rec.departed = false;
    }
    departed_ = trace_records_.empty();
  }
  free_blocks(blocks);
}

void Balancer::record_access_locked(const Request& r) {
  // Only the trace policy reads records; a prompt longer than the limit (or a
  // process that never ends one) keeps none, so memory stays bounded.
  if (config_.policy != PolicyKind::Trace) return;
  const TraceKey k{r.model, r.kind, r.key};
  if (trace_now_.size() < kTraceLimit) {
    trace_now_first_.emplace(k, static_cast<uint32_t>(trace_now_.size()));
    trace_now_.push_back(k);
  } else if (!trace_overflow_) {
    trace_overflow_ = true;
    trace_now_ = {};
    trace_now_first_ = {};
  }
  if (departed_) return;
  bool following = false;
  for (TraceRecord& rec : trace_records_) {
    if (rec.departed) continue;
    const size_t window = std::max<size_t>(64, rec.keys.size() / 50);
    bool found = false;
    if (auto it = rec.pos.find(k); it != rec.pos.end()) {
      auto pos = std::lower_bound(it->second.begin(), it->second.end(), static_cast<uint32_t>(rec.cursor));
      if (pos != it->second.end() && *pos - rec.cursor <= window) {
        rec.cursor = *pos + 1;
        found = true;
      }
    }
    // A patch set that changed (a LoRA swap) leaves the weights' order as it was.
    if (!found && k.kind != Kind::Patches) rec.departed = true;
    following |= !rec.departed;
  }
  if (!following) {
    departed_ = true;
    trace_departures_++;
  }
}

uint64_t Balancer::trace_next_use_locked(const TraceKey& k) const {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  uint64_t best = kNever;
  size_t active = trace_records_.size();
  for (size_t i = 0; i < trace_records_.size(); ++i) {
    const TraceRecord& rec = trace_records_[i];
    if (rec.departed) continue;
    if (active == trace_records_.size()) active = i;
    auto it = rec.pos.find(k);
    if (it == rec.pos.end()) continue;
    auto pos = std::lower_bound(it->second.begin(), it->second.end(), static_cast<uint32_t>(rec.cursor));
    if (pos != it->second.end()) best = std::min<uint64_t>(best, *pos - rec.cursor);
  }
  if (best != kNever || active == trace_records_.size()) return best;
  // Not used again in this prompt: when the prompt that followed the active
  // record last time comes again (Note [Trace policy]).
  const TraceRecord& ref = trace_records_[active];
  const uint64_t rest = ref.keys.size() - std::min(ref.cursor, ref.keys.size());
  uint64_t next_len = ref.keys.size();
  if (active == 0) {
    if (auto it = trace_now_first_.find(k); it != trace_now_first_.end()) return rest + it->second;
  } else {
    const TraceRecord& next = trace_records_[active - 1];
    if (auto it = next.pos.find(k); it != next.pos.end()) return rest + it->second.front();
    next_len = next.keys.size();
  }
  if (auto it = ref.pos.find(k); it != ref.pos.end()) return rest + next_len + it->second.front();
  return kNever;
}

Pin* Balancer::find_locked(Model& m, Subset s, const Request& r, std::vector<void*>& to_free) {
  auto it = m.pins[static_cast<int>(s)].find(r.key);
  if (it == m.pins[static_cast<int>(s)].end()) return nullptr;
  Pin* p = it->second.get();
  if (p->state == PinState::Evicting) return p;  // the caller serves this cast from the source
  const bool stale = p->version != r.version || (p->guard && !p->guard->alive()) ||
                     (is_patch(s) && p->signature != r.signature);
  if (!stale) return p;
  m.stats[static_cast<int>(s)].dropped++;
  unlink_locked(p, to_free);
  return nullptr;
}

Lease Balancer::acquire(const Request& r, const std::function<std::unique_ptr<SourceGuard>()>& make_guard) {
  PINS_CHECK_VALUE(r.bytes > 0, "acquire: source bytes must be positive, got ", r.bytes);
  std::vector<void*> stale;
  Subset target;
  Lease found;  // a hit, or none with `served` for a pin busy elsewhere
  bool served = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    Model& m = model_locked(r.model, "cast_to_device");
    record_access_locked(r);
    m.last_use = ++clock_;
    const Subset ss = streaming_subset(r.kind), cs = cache_subset(r.kind);
    // DESIGN.md: the streaming subset first, then an existing -loaded pin,
    // whatever the mode.
    Pin* p = find_locked(m, ss, r, stale);
    if (p == nullptr) p = find_locked(m, cs, r, stale);
    if (p != nullptr) {
      SubsetStats& st = m.stats[static_cast<int>(p->subset)];
      if (p->state == PinState::Live) {
        st.hits++;
        st.hit_bytes += static_cast<int64_t>(p->bytes);
        p->users++;
        p->last_use = clock_;
        found.owner_ = this;
        found.pin_ = p;
        found.hit_ = true;
      } else {
        // Still being filled or evicted by another thread: serve from the source.
        busy_misses_++;
        st.misses++;
        st.miss_bytes += static_cast<int64_t>(r.bytes);
      }
      served = true;
    } else {
      const bool cache_allowed = !config_.fast_disk && config_.policy != PolicyKind::Lru;
      target = (r.resident && cache_allowed && (r.kind == Kind::Weights || r.signature.has_value())) ? cs : ss;
      SubsetStats& st = m.stats[static_cast<int>(target)];
      st.misses++;
      st.miss_bytes += static_cast<int64_t>(r.bytes);
    }
  }
  free_blocks(stale);  // stale pins dropped by either lookup
  if (served) return found;

  // One read of system memory serves both checks: freeing changes what is
  // available, not the total and swap the ceiling depends on.
  const MemoryInfo mi = probe_.read();
  void* block = nullptr;
  if (ensure_budget(r.bytes, is_streaming(target), mi)) {
    const bool lock = !pool_.backend().can_lock() || ensure_lock_room(r.bytes, mi);
    block = pool_.try_allocate(r.bytes, lock);
  }
  if (block == nullptr) {
    std::lock_guard<std::mutex> g(mu_);
    refused_locked(r.model);
    return {};
  }
  std::unique_ptr<SourceGuard> guard = make_guard ? make_guard() : nullptr;

  std::unique_lock<std::mutex> g(mu_);
  auto it = models_.find(r.model);
  const int s = static_cast<int>(target);
  const bool raced = it != models_.end() && (it->second->pins[static_cast<int>(streaming_subset(r.kind))].count(r.key) ||
                                             it->second->pins[static_cast<int>(cache_subset(r.kind))].count(r.key));
  if (it == models_.end() || raced) {
    // Forgotten meanwhile, or another thread pinned the same source: copy from the source.
    g.unlock();
    pool_.free(block);
    return {};
  }
  Model& m = *it->second;
  auto pin = std::make_unique<Pin>();
  Pin* p = pin.get();
  p->key = r.key;
  p->subset = target;
  p->model = r.model;
  p->bytes = r.bytes;
  p->block = block;
  p->created = ++seq_;
  p->last_use = clock_;
  if (is_patch(target)) p->signature = r.signature;
  p->version = r.version;
  p->guard = std::move(guard);
  p->state = PinState::Filling;
  p->users = 1;
  m.pins[s].emplace(r.key, std::move(pin));
  m.by_created[s].emplace(p->created, p);
  m.stats[s].pins++;
  m.stats[s].bytes += static_cast<int64_t>(r.bytes);
  m.stats[s].created++;
  Lease l;
  l.owner_ = this;
  l.pin_ = p;
  l.fill_ = true;
  return l;
}

void Balancer::mark_filled(Pin* p) {
  std::lock_guard<std::mutex> g(mu_);
  if (p->state == PinState::Filling) p->state = PinState::Live;
}

void Balancer::release(Pin* p) {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> g(mu_);
    p->users--;
    if (p->orphaned) {
      if (p->users == 0) reap_orphan_locked(p, blocks);
    } else if (p->state == PinState::Filling && p->users == 0) {
      // Dropped before filled(): the pin holds garbage.
      stats_locked(*p).dropped++;
      unlink_locked(p, blocks);
    }
  }
  free_blocks(blocks);
}

// ------------------------------------------------------------------ budget

bool Balancer::ensure_budget(size_t bytes, bool streaming) { return ensure_budget(bytes, streaming, probe_.read()); }

bool Balancer::ensure_budget(size_t bytes, bool streaming, const MemoryInfo& mi) {
  PINS_RANGE("pins::ensure_budget");
  const Config c = config();
  const uint64_t reserve = std::max(c.headroom / 2, c.pin_reserve);
  const uint64_t need = bytes + reserve;
  if (need <= mi.available) return true;
  const size_t shortfall = need - mi.available;
  const size_t freed = free_along_tiers(shortfall + c.pin_slack, streaming, false);
  return freed >= shortfall;
}

bool Balancer::ensure_lock_room(size_t bytes, const MemoryInfo& mi) {
  PINS_RANGE("pins::ensure_lock_room");
  const Config c = config();
  const uint64_t ceiling = pin_ceiling(mi, c);
  const auto locked = [&] { return static_cast<uint64_t>(pool_.stats().locked_bytes.current); };
  if (locked() + bytes <= ceiling) return true;
  // Note [Pin eviction tiers]: drop page-locks (keeping the memory) in eviction
  // order until the new pin fits under the ceiling with lock_hysteresis to spare.
  const uint64_t goal = ceiling > c.lock_hysteresis + bytes ? ceiling - c.lock_hysteresis - bytes : 0;
  std::vector<std::pair<Pin*, void*>> order;
  {
    std::lock_guard<std::mutex> g(mu_);
    const uint64_t now = locked();
    const uint64_t need = now > goal ? now - goal : 0;
    uint64_t got = 0;
    for (const Candidate& cand : order_locked(true, false)) {
      if (got >= need) break;
      Pin* p = cand.pin;
      if (p->state != PinState::Live || p->users > 0 || p->block == nullptr || !pool_.is_locked(p->block)) continue;
      p->state = PinState::Evicting;  // held against eviction and reuse while its lock drops
      order.emplace_back(p, p->block);
      got += p->bytes;
    }
  }
  std::vector<bool> dropped(order.size(), false);
  for (size_t i = 0; i < order.size() && locked() > goal; ++i)
    if (pool_.is_locked(order[i].second)) dropped[i] = pool_.unlock(order[i].second) > 0;
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t j = 0; j < order.size(); ++j) {
      Pin* p = order[j].first;
      if (dropped[j] && !p->orphaned) stats_locked(*p).lock_drops++;
      if (p->orphaned) {
        reap_orphan_locked(p, blocks);
      } else {
        p->state = PinState::Live;
      }
    }
  }
  free_blocks(blocks);
  return locked() + bytes <= ceiling;
}

int Balancer::tier_locked(const Pin& p, const Model& m) const {
  const bool in_prompt = m.in_prompt || m.active;
  const bool streaming = is_streaming(p.subset);
  if (!in_prompt) return streaming ? 1 : 2;
  if (!streaming) return 3;
  return m.active ? 5 : 4;
}

std::vector<Balancer::Candidate> Balancer::order_locked(bool streaming_request, bool evict_active) {
  struct Row {
    Candidate c;
    const Model* m;
    uint64_t next_use;
  };
  std::vector<Row> rows;
  for (auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s)
      for (auto& [created, p] : m->by_created[s]) {
        const int tier = tier_locked(*p, *m);
        if ((tier == 4 && !streaming_request) || (tier == 5 && !evict_active)) continue;
        rows.push_back({{p, tier}, m.get(), 0});
      }
  const PolicyKind policy = config_.policy;
  if (policy == PolicyKind::Trace && !departed_) {
    // Note [Trace policy]: farthest predicted next use first.
    for (Row& r : rows)
      r.next_use = trace_next_use_locked(
          {r.c.pin->model, is_patch(r.c.pin->subset) ? Kind::Patches : Kind::Weights, r.c.pin->key});
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

size_t Balancer::free_along_tiers(size_t bytes, bool streaming_request, bool evict_active) {
  PINS_RANGE("pins::free");
  size_t freed = sweep();  // pins of dead sources are free wins before any tier
  std::unordered_set<Pin*> skipped;
  while (freed < bytes) {
    std::vector<Candidate> batch;
    {
      std::lock_guard<std::mutex> g(mu_);
      size_t want = bytes - freed, got = 0;
      for (const Candidate& c : order_locked(streaming_request, evict_active)) {
        Pin* p = c.pin;
        if (skipped.count(p)) continue;
        if (p->users > 0 || p->state != PinState::Live) {
          stats_locked(*p).inflight_skips++;
          skipped.insert(p);
          continue;
        }
        p->state = PinState::Evicting;
        batch.push_back(c);
        got += p->bytes;
        if (got >= want) break;
      }
    }
    if (batch.empty()) break;
    // Fence queries may call the driver: outside mu_ (Note [Balancer locking]).
    std::vector<bool> busy(batch.size());
    for (size_t i = 0; i < batch.size(); ++i)
      busy[i] = batch[i].pin->block != nullptr && pool_.in_flight(batch[i].pin->block);
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (size_t i = 0; i < batch.size(); ++i) {
        Pin* p = batch[i].pin;
        if (p->orphaned) {  // forgotten meanwhile: ours to free
          freed += p->bytes;
          reap_orphan_locked(p, blocks);
          continue;
        }
        SubsetStats& st = stats_locked(*p);
        if (busy[i]) {
          p->state = PinState::Live;
          st.inflight_skips++;
          skipped.insert(p);
          continue;
        }
        st.evictions[batch[i].tier - 1]++;
        st.evicted_bytes += static_cast<int64_t>(p->bytes);
        freed += p->bytes;
        p->state = PinState::Live;  // unlink frees it now that nobody holds it
        unlink_locked(p, blocks);
      }
    }
    free_blocks(blocks);
  }
  if (freed > 0) pool_.trim(0);  // give the RAM back to the OS now
  return freed;
}

size_t Balancer::free(size_t bytes, bool evict_active) { return free_along_tiers(bytes, true, evict_active); }

size_t Balancer::relieve() {
  PINS_RANGE("pins::relieve");
  const MemoryInfo mi = probe_.read();
  const Config c = config();
  {
    std::lock_guard<std::mutex> g(mu_);
    relieve_calls_++;
  }
  if (mi.available >= c.headroom) return 0;
  const size_t freed = free_along_tiers(c.headroom - mi.available + c.relieve_slack, true, false);
  std::lock_guard<std::mutex> g(mu_);
  pressure_freed_ += static_cast<int64_t>(freed);
  return freed;
}

size_t Balancer::sweep() {
  std::vector<void*> blocks;
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    const auto dead = [](const Pin& p) { return p.state == PinState::Live && p.guard && !p.guard->alive(); };
    for (auto& [id, m] : models_)
      for (int s = 0; s < kSubsets; ++s) bytes += drop_if_locked(*m, static_cast<Subset>(s), dead, blocks);
  }
  free_blocks(blocks);
  return bytes;
}

// ------------------------------------------------------------------ stats

SubsetStats Balancer::subset_stats(ModelId model, Subset s) const {
  std::lock_guard<std::mutex> g(mu_);
  return model_locked(model, "subset_stats").stats[static_cast<int>(s)];
}

std::vector<Balancer::PinInfo> Balancer::pins() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<PinInfo> out;
  for (const auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s)
      for (const auto& [created, p] : m->by_created[s])
        out.push_back({id, p->subset, p->key, p->bytes, p->block != nullptr && pool_.is_locked(p->block)});
  return out;
}

std::vector<std::pair<std::string, int64_t>> Balancer::stats() const {
  const PoolStats ps = pool_.stats();
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::pair<std::string, int64_t>> out;
  SubsetStats total[kSubsets];
  int64_t pins = 0, bytes = 0, hits = 0, misses = 0, hit_bytes = 0, miss_bytes = 0, evictions = 0;
  int64_t evicted_bytes = 0, dropped = 0, lock_drops = 0, skips = 0;
  int64_t by_tier[kTiers] = {};
  for (const auto& [id, m] : models_) {
    const std::string prefix = "model." + std::to_string(id) + ".";
    int64_t mp = 0, mb = 0;
    for (int s = 0; s < kSubsets; ++s) {
      const SubsetStats& st = m->stats[s];
      const std::string sp = prefix + to_string(static_cast<Subset>(s)) + ".";
      out.emplace_back(sp + "pins", st.pins);
      out.emplace_back(sp + "bytes", st.bytes);
      out.emplace_back(sp + "hits", st.hits);
      out.emplace_back(sp + "misses", st.misses);
      out.emplace_back(sp + "hit_bytes", st.hit_bytes);
      out.emplace_back(sp + "miss_bytes", st.miss_bytes);
      out.emplace_back(sp + "created", st.created);
      out.emplace_back(sp + "evicted_bytes", st.evicted_bytes);
      out.emplace_back(sp + "dropped", st.dropped);
      out.emplace_back(sp + "lock_drops", st.lock_drops);
      out.emplace_back(sp + "inflight_skips", st.inflight_skips);
      for (int t = 0; t < kTiers; ++t) out.emplace_back(sp + "evictions.tier" + std::to_string(t + 1), st.evictions[t]);
      total[s].pins += st.pins;
      total[s].bytes += st.bytes;
      total[s].hits += st.hits;
      total[s].misses += st.misses;
      mp += st.pins;
      mb += st.bytes;
      hits += st.hits;
      misses += st.misses;
      hit_bytes += st.hit_bytes;
      miss_bytes += st.miss_bytes;
      evicted_bytes += st.evicted_bytes;
      dropped += st.dropped;
      lock_drops += st.lock_drops;
      skips += st.inflight_skips;
      for (int t = 0; t < kTiers; ++t) {
        by_tier[t] += st.evictions[t];
        evictions += st.evictions[t];
      }
    }
    out.emplace_back(prefix + "pins", mp);
    out.emplace_back(prefix + "bytes", mb);
    out.emplace_back(prefix + "refusals", m->refusals);
    out.emplace_back(prefix + "active", m->active);
    out.emplace_back(prefix + "in_prompt", m->in_prompt);
    pins += mp;
    bytes += mb;
  }
  for (int s = 0; s < kSubsets; ++s) {
    const std::string sp = std::string(to_string(static_cast<Subset>(s))) + ".";
    out.emplace_back(sp + "pins", total[s].pins);
    out.emplace_back(sp + "bytes", total[s].bytes);
    out.emplace_back(sp + "hits", total[s].hits);
    out.emplace_back(sp + "misses", total[s].misses);
  }
  for (int t = 0; t < kTiers; ++t) out.emplace_back("evictions.tier" + std::to_string(t + 1), by_tier[t]);
  out.emplace_back("pins", pins);
  out.emplace_back("pinned_bytes", bytes);
  out.emplace_back("hits", hits);
  out.emplace_back("misses", misses);
  out.emplace_back("hit_bytes", hit_bytes);
  out.emplace_back("miss_bytes", miss_bytes);
  out.emplace_back("evictions", evictions);
  out.emplace_back("evicted_bytes", evicted_bytes);
  out.emplace_back("dropped", dropped);
  out.emplace_back("lock_drops", lock_drops);
  out.emplace_back("inflight_skips", skips);
  out.emplace_back("refusals", refusals_);
  out.emplace_back("busy_misses", busy_misses_);
  out.emplace_back("pressure_freed_bytes", pressure_freed_);
  out.emplace_back("relieve_calls", relieve_calls_);
  out.emplace_back("trace_departures", trace_departures_);
  out.emplace_back("trace_records", static_cast<int64_t>(trace_records_.size()));
  out.emplace_back("prompt", prompt_);
  out.emplace_back("models", static_cast<int64_t>(models_.size()));
  out.emplace_back("committed_bytes", ps.committed_bytes.current);
  out.emplace_back("locked_bytes", ps.locked_bytes.current);
  out.emplace_back("reserved_bytes", ps.reserved_bytes.current);
  out.emplace_back("pool_allocated_bytes", ps.allocated_bytes.current);
  out.emplace_back("pool_requested_bytes", ps.requested_bytes.current);
  out.emplace_back("pool_committed_peak_bytes", ps.committed_bytes.peak);
  out.emplace_back("pool_registrations", ps.registrations);
  out.emplace_back("pool_lock_ns", ps.lock_ns);
  out.emplace_back("pool_refusals", ps.refusals);
  out.emplace_back("pool_deferred_frees", ps.deferred_frees);
  return out;
}

}  // namespace pins
