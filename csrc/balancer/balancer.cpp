#include "csrc/balancer/balancer.h"

#include <algorithm>
#include <cstdint>
#include <unordered_set>

#include "csrc/balancer/budget.h"
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

const char* to_string(Bypass b) {
  switch (b) {
    case Bypass::Empty: return "empty";
    case Bypass::Refused: return "refused";
    case Bypass::Pool: return "pool";
    case Bypass::Busy: return "busy";
    case Bypass::Raced: return "raced";
    case Bypass::Forgotten: return "forgotten";
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
    MutexLock g(mu_);
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
  MutexLock g(mu_);
  if (config.policy != config_.policy) trace_.depart();  // the cursors did not follow this prompt
  config_ = config;
}

Config Balancer::config() const {
  MutexLock g(mu_);
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

ModelId Balancer::register_model(std::string name, std::string load_device, ModelOptions options) {
  MutexLock g(mu_);
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

bool Balancer::has_model(ModelId model) const {
  MutexLock g(mu_);
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
  sources_.remove(p);
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

void Balancer::bypass_locked(ModelId model, Bypass why) {
  const int i = static_cast<int>(why);
  bypassed_[i]++;
  const bool refusal = why == Bypass::Refused || why == Bypass::Pool;
  if (refusal) refusals_++;
  if (auto it = models_.find(model); it != models_.end()) {
    it->second->bypassed[i]++;
    if (refusal) it->second->refusals++;
  }
}

size_t Balancer::drop_if_locked(Model& m, Subset s, const std::function<bool(const Pin&)>& pred,
                                std::vector<void*>& to_free, bool invalidated) {
  std::vector<Pin*> doomed;  // collected first: unlinking erases from the map being walked
  for (auto& [key, p] : m.pins[static_cast<int>(s)])
    if (pred(*p)) doomed.push_back(p.get());
  size_t bytes = 0;
  for (Pin* p : doomed) {
    m.stats[static_cast<int>(s)].dropped++;
    if (invalidated) m.stats[static_cast<int>(s)].invalidated++;
    bytes += p->bytes;
    unlink_locked(p, to_free);
  }
  return bytes;
}

void Balancer::link_locked(Model& m, std::unique_ptr<Pin> pin) {
  Pin* p = pin.get();
  const int s = static_cast<int>(p->subset);
  m.pins[s].emplace(p->key, std::move(pin));
  m.by_created[s].emplace(p->created, p);
  sources_.add(p);
  m.stats[s].pins++;
  m.stats[s].bytes += static_cast<int64_t>(p->bytes);
  m.stats[s].created++;
}

void Balancer::forget_model(ModelId model) {
  std::vector<void*> blocks;
  {
    MutexLock g(mu_);
    Model& m = model_locked(model, "forget_model");
    for (int s = 0; s < kSubsets; ++s) drop_if_locked(m, static_cast<Subset>(s), [](const Pin&) { return true; }, blocks);
    models_.erase(model);
  }
  free_blocks(blocks);
}

void Balancer::set_active(ModelId model, bool active) {
  MutexLock g(mu_);
  Model& m = model_locked(model, "set_active");
  if (active && !m.active) m.load_seq = ++seq_;
  m.active = active;
}

void Balancer::mark_prompt(const std::vector<ModelId>& models) {
  MutexLock g(mu_);
  for (ModelId id : models) model_locked(id, "mark_prompt");  // all or nothing
  prompt_ = true;
  for (ModelId id : models) models_.at(id)->in_prompt = true;
}

void Balancer::end_node() {
  PINS_RANGE("pins::end_node");
  std::vector<void*> blocks;
  {
    MutexLock g(mu_);
    for (auto& [id, m] : models_) {
      m->active = false;
      drop_if_locked(*m, Subset::Patches, [](const Pin& p) { return p.state != PinState::Evicting; }, blocks);
    }
  }
  free_blocks(blocks);
}

bool Balancer::prompt_running() const {
  MutexLock g(mu_);
  return prompt_;
}

void Balancer::end_prompt() {
  PINS_RANGE("pins::end_prompt");
  std::vector<void*> blocks;
  {
    MutexLock g(mu_);
    prompt_ = false;
    for (auto& [id, m] : models_) {
      m->in_prompt = false;
      drop_if_locked(*m, Subset::Patches, [](const Pin& p) { return p.state != PinState::Evicting; }, blocks);
    }
    trace_.end_prompt();  // Note [Trace policy]: this prompt's record becomes the reference
  }
  free_blocks(blocks);
}

Pin* Balancer::find_locked(Model& m, Subset s, const Request& r, std::vector<void*>& to_free) {
  auto it = m.pins[static_cast<int>(s)].find(r.key);
  if (it == m.pins[static_cast<int>(s)].end()) return nullptr;
  Pin* p = it->second.get();
  if (p->state == PinState::Evicting) return p;  // the caller serves this cast from the source
  // Note [Pin validity]. A gathered pin's parts also tell apart two groups
  // whose keys collide: the other group is re-pinned, never served.
  const bool stale = p->version != r.version || p->signature != r.signature || p->parts != r.parts ||
                     (p->guard && !p->guard->alive());
  if (!stale) return p;
  m.stats[static_cast<int>(s)].dropped++;
  unlink_locked(p, to_free);
  return nullptr;
}

Lease Balancer::acquire(const Request& r, const std::function<std::unique_ptr<SourceGuard>()>& make_guard) {
  std::vector<void*> stale;
  Subset target;
  Lease found;  // a hit, or none with `served` for a pin busy elsewhere
  bool served = false;
  {
    MutexLock g(mu_);
    Model& m = model_locked(r.model, "cast_to_device");
    if (r.bytes == 0) {
      bypass_locked(r.model, Bypass::Empty);
      return {};
    }
    if (config_.policy == PolicyKind::Trace) trace_.record({r.model, r.kind, r.key});
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
        bypass_locked(r.model, Bypass::Busy);
        st.misses++;
        st.miss_bytes += static_cast<int64_t>(r.bytes);
      }
      served = true;
    } else {
      const bool cache_allowed = !config_.fast_disk && !m.options.fast_disk && config_.policy != PolicyKind::Lru;
      target = target_subset(r.kind, r.resident, r.signature.has_value(), cache_allowed);
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
  const bool budget = ensure_budget(r.bytes, target, mi);
  if (budget) {
    const bool lock = !pool_.backend().can_lock() || ensure_lock_room(r.bytes, mi);
    block = pool_.try_allocate(r.bytes, lock);
  }
  if (block == nullptr) {
    MutexLock g(mu_);
    bypass_locked(r.model, budget ? Bypass::Pool : Bypass::Refused);
    return {};
  }
  std::unique_ptr<SourceGuard> guard = make_guard ? make_guard() : nullptr;

  Lease l;
  {
    MutexLock g(mu_);
    auto it = models_.find(r.model);
    const bool raced = it != models_.end() && (it->second->pins[static_cast<int>(streaming_subset(r.kind))].count(r.key) ||
                                               it->second->pins[static_cast<int>(cache_subset(r.kind))].count(r.key));
    // Forgotten meanwhile, or another thread pinned the same source: copy from
    // the source (the block goes back to the pool below, outside mu_).
    if (it == models_.end()) {
      bypass_locked(r.model, Bypass::Forgotten);
    } else if (raced) {
      bypass_locked(r.model, Bypass::Raced);
    } else {
      auto pin = std::make_unique<Pin>();
      Pin* p = pin.get();
      p->key = r.key;
      p->subset = target;
      p->model = r.model;
      p->bytes = r.bytes;
      p->block = block;
      p->created = ++seq_;
      p->last_use = clock_;
      p->signature = r.signature;
      p->version = r.version;
      p->span = r.span;
      p->parts = r.parts;
      p->guard = std::move(guard);
      p->state = PinState::Filling;
      p->users = 1;
      link_locked(*it->second, std::move(pin));
      l.owner_ = this;
      l.pin_ = p;
      l.fill_ = true;
    }
  }
  if (!l) pool_.free(block);
  return l;
}

void Balancer::mark_filled(Pin* p) {
  MutexLock g(mu_);
  if (p->state == PinState::Filling) p->state = PinState::Live;
}

void Balancer::release(Pin* p) {
  std::vector<void*> blocks;
  {
    MutexLock g(mu_);
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

bool Balancer::ensure_budget(size_t bytes, Subset target, const MemoryInfo& mi) {
  PINS_RANGE("pins::ensure_budget");
  const Config c = config();
  const uint64_t shortfall = pin_shortfall(bytes, mi.available, c);
  if (shortfall == 0) return true;
  // Note [Pin eviction tiers]: only a streaming pin may take tier 4.
  const Reach reach = is_streaming(target) ? Reach::SpareActive : Reach::SparePromptStreaming;
  return free_along_tiers(pin_free_goal(shortfall, c), reach) >= shortfall;
}

bool Balancer::ensure_lock_room(size_t bytes, const MemoryInfo& mi) {
  PINS_RANGE("pins::ensure_lock_room");
  const Config c = config();
  const uint64_t ceiling = pin_ceiling(mi, c);
  const auto locked = [&] { return static_cast<uint64_t>(pool_.stats().locked_bytes.current); };
  if (lock_fits(locked(), bytes, ceiling)) return true;
  // Note [Pin eviction tiers]: drop page-locks (keeping the memory) in eviction
  // order until the new pin fits under the ceiling with lock_hysteresis to spare.
  const uint64_t goal = lock_drop_goal(ceiling, bytes, c);
  std::vector<std::pair<Pin*, void*>> order;
  {
    MutexLock g(mu_);
    const uint64_t now = locked();
    const uint64_t need = now > goal ? now - goal : 0;
    uint64_t got = 0;
    for (const Candidate& cand : order_locked(Reach::SpareActive)) {
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
    MutexLock g(mu_);
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
  return lock_fits(locked(), bytes, ceiling);
}

std::vector<Candidate> Balancer::order_locked(Reach reach) const {
  return eviction_order(models_, reach, config_.policy, trace_);
}

size_t Balancer::free_along_tiers(size_t bytes, Reach reach) {
  PINS_RANGE("pins::free");
  size_t freed = sweep();  // pins of dead sources are free wins before any tier
  std::unordered_set<Pin*> skipped;
  while (freed < bytes) {
    std::vector<Candidate> batch;
    {
      MutexLock g(mu_);
      size_t want = bytes - freed, got = 0;
      for (const Candidate& c : order_locked(reach)) {
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
      MutexLock g(mu_);
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

size_t Balancer::free(size_t bytes, bool evict_active) {
  return free_along_tiers(bytes, evict_active ? Reach::All : Reach::SpareActive);
}

size_t Balancer::relieve() {
  PINS_RANGE("pins::relieve");
  const MemoryInfo mi = probe_.read();
  const Config c = config();
  {
    MutexLock g(mu_);
    relieve_calls_++;
  }
  const uint64_t shortfall = relieve_shortfall(mi.available, c);
  if (shortfall == 0) return 0;
  const size_t freed = free_along_tiers(relieve_free_goal(shortfall, c), Reach::SpareActive);
  MutexLock g(mu_);
  pressure_freed_ += static_cast<int64_t>(freed);
  return freed;
}

size_t Balancer::invalidate(uint64_t storage, uint64_t offset, uint64_t span) {
  PINS_RANGE("pins::invalidate");
  std::vector<void*> blocks;
  size_t bytes = 0;
  {
    MutexLock g(mu_);
    const uint64_t end = span > UINT64_MAX - offset ? UINT64_MAX : offset + span;
    for (Pin* p : sources_.overlapping(storage, offset, end)) {
      // Whatever its state: a pin being filled, evicted or page-unlocked is
      // detached (orphaned) by unlink and never served again.
      SubsetStats& st = stats_locked(*p);
      st.dropped++;
      st.invalidated++;
      bytes += p->bytes;
      unlink_locked(p, blocks);
    }
  }
  free_blocks(blocks);
  return bytes;
}

size_t Balancer::invalidate_model(ModelId model) {
  PINS_RANGE("pins::invalidate_model");
  std::vector<void*> blocks;
  size_t bytes = 0;
  {
    MutexLock g(mu_);
    Model& m = model_locked(model, "invalidate_model");
    for (int s = 0; s < kSubsets; ++s)
      bytes += drop_if_locked(m, static_cast<Subset>(s), [](const Pin&) { return true; }, blocks, /*invalidated=*/true);
  }
  free_blocks(blocks);
  return bytes;
}

size_t Balancer::sweep() {
  std::vector<void*> blocks;
  size_t bytes = 0;
  {
    MutexLock g(mu_);
    const auto dead = [](const Pin& p) { return p.state == PinState::Live && p.guard && !p.guard->alive(); };
    for (auto& [id, m] : models_)
      for (int s = 0; s < kSubsets; ++s) bytes += drop_if_locked(*m, static_cast<Subset>(s), dead, blocks);
  }
  free_blocks(blocks);
  return bytes;
}

// ------------------------------------------------------------------ stats

SubsetStats Balancer::subset_stats(ModelId model, Subset s) const {
  MutexLock g(mu_);
  return model_locked(model, "subset_stats").stats[static_cast<int>(s)];
}

std::vector<Balancer::PinInfo> Balancer::pins() const {
  MutexLock g(mu_);
  std::vector<PinInfo> out;
  for (const auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s)
      for (const auto& [created, p] : m->by_created[s])
        out.push_back({id, p->subset, p->key, p->bytes, p->block != nullptr && pool_.is_locked(p->block)});
  return out;
}

BalancerStats Balancer::stats() const {
  MutexLock g(mu_);
  BalancerStats out;
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
    out.total += ms.total;
    out.models.push_back(std::move(ms));
  }
  out.refusals = refusals_;
  out.busy_misses = busy_misses_;
  for (int b = 0; b < kBypassReasons; ++b) out.bypassed[b] = bypassed_[b];
  out.plain_copies = plain_copies_.load(std::memory_order_relaxed);
  out.pressure_freed_bytes = pressure_freed_;
  out.relieve_calls = relieve_calls_;
  out.trace_departures = trace_.departures();
  out.trace_records = static_cast<int64_t>(trace_.records());
  out.prompt = prompt_;
  return out;
}

}  // namespace pins
