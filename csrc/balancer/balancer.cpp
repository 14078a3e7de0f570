#include "csrc/balancer/balancer.h"

#include <algorithm>
#include <chrono>
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
    case Bypass::Unlocking: return "unlocking";
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
    : pool_(pool), probe_(probe), config_(config) {
  MutexLock g(mu_);
  reuse_on_ = config_.policy == PolicyKind::Reuse;  // no pins yet: nothing to index
}

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
  set_reuse_indexes_locked(config_.policy == PolicyKind::Reuse);
  if (config_.policy != PolicyKind::Trace) clear_trace_index_locked();
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
  m.by_use[s].erase({p->last_use, p->created});
  if (reuse_on_) reuse_unindex_locked(m, p);
  trace_unindex(m, p);
  sources_.remove(p);
  ring_remove_locked(p);
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
  m.by_use[s].emplace(std::make_pair(p->last_use, p->created), p);
  if (reuse_on_) reuse_index_locked(m, p);
  if (trace_index_current_locked()) trace_index(m, p, trace_);
  sources_.add(p);
  ring_add_locked(p);
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
    // Lifetime totals never decrease: its COUNTs and SUMs stay in them. Its
    // levels are 0 now (leased pins were detached and left them).
    for (int s = 0; s < kSubsets; ++s) {
      PINS_ASSERT(m.stats[s].pins == 0 && m.stats[s].bytes == 0);
      retired_[s] += m.stats[s];
    }
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
    reuse_.end_prompt(clock_);
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
  Subset target{};  // set below before any use; initialized for -Wmaybe-uninitialized
  Lease found;  // a hit, or none with `served` for a pin busy elsewhere
  bool served = false;
  uint64_t settled_at_read = 0;  // Note [Budget reservation]: before the reading below
  uint64_t reuse_gap = 0;  // Note [Reuse policy]: the key's prompt gap, for its pin
  {
    MutexLock g(mu_);
    Model& m = model_locked(r.model, r.op);
    if (r.bytes == 0) {
      bypass_locked(r.model, Bypass::Empty);
      return {};
    }
    reclaim_step_locked(stale, kReclaimPerCall);  // Note [Dead source reclaim]
    settled_at_read = settled_;
    if (config_.policy == PolicyKind::Trace) {
      // Note [Trace index]: the pins whose rank this access moves, when the
      // indexes are kept and the active record stays.
      const bool indexed = trace_index_current_locked();
      trace_moved_.clear();
      trace_.record({r.model, r.kind, r.key}, indexed ? &trace_moved_ : nullptr);
      if (indexed && trace_index_current_locked()) retrace_locked(trace_moved_);
    }
    m.last_use = ++clock_;
    if (config_.policy == PolicyKind::Reuse) reuse_gap = reuse_.record({r.model, r.kind, r.key});
    const Subset ss = streaming_subset(r.kind), cs = cache_subset(r.kind);
    // DESIGN.md: the streaming subset first, then an existing -loaded pin,
    // whatever the mode.
    Pin* p = find_locked(m, ss, r, stale);
    if (p == nullptr) p = find_locked(m, cs, r, stale);
    if (p != nullptr) {
      SubsetStats& st = m.stats[static_cast<int>(p->subset)];
      if (p->state == PinState::Live && p->block != nullptr && !pool_.begin_copy(p->block)) {
        // Note [Copies from a block]: its extent's page-lock is being dropped.
        bypass_locked(r.model, Bypass::Unlocking);
        st.misses++;
        st.miss_bytes += static_cast<int64_t>(r.bytes);
      } else if (p->state == PinState::Live) {
        st.hits++;
        st.hit_bytes += static_cast<int64_t>(p->bytes);
        p->users++;
        // Note [Eviction walk]: by_use moves with last_use (the node is reused).
        auto& by_use = m.by_use[static_cast<int>(p->subset)];
        auto node = by_use.extract({p->last_use, p->created});
        if (reuse_on_) reuse_unindex_locked(m, p);
        p->last_use = clock_;
        node.key() = {p->last_use, p->created};
        by_use.insert(std::move(node));
        p->reuse_gap = reuse_gap;
        if (reuse_on_) reuse_index_locked(m, p);
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

  // One reading of system memory serves both checks: freeing changes what is
  // available, not the total and swap the ceiling depends on.
  MemoryInfo mi = memory();
  void* block = nullptr;
  const bool budget = ensure_budget(r.bytes, target, mi, settled_at_read);  // reserves r.bytes
  if (budget) {
    const bool lock = !pool_.backend().can_lock() || ensure_lock_room(r.bytes, mi);
    block = pool_.try_allocate(r.bytes, lock);
    keep_warm(memory(), config().headroom);  // what the reuse above left idle
  }
  {
    MutexLock g(mu_);
    // Note [Budget reservation]: the pool accounts for the block now.
    if (budget) reserved_ -= r.bytes;
    if (block != nullptr) settled_ += r.bytes;
    if (block == nullptr) {
      bypass_locked(r.model, budget ? Bypass::Pool : Bypass::Refused);
      return {};
    }
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
    } else if (!pool_.begin_copy(block)) {
      // Note [Copies from a block]: the block's extent is losing its page-lock.
      bypass_locked(r.model, Bypass::Unlocking);
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
      p->reuse_gap = reuse_gap;
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
  // Note [Copies from a block]: the op recorded its copy's fence before letting
  // go. The lease still holds p (users), so neither p nor its block is gone.
  if (p->block != nullptr) pool_.end_copy(p->block);
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

// Note [Memory readings]
// A reading of system memory (SystemMemoryProbe: /proc/meminfo and every cgroup
// level, tens of microseconds) is reused for the probe's max_age_ns (5 ms for
// the system; 0, read every time, for the models of memory in tests and the
// simulator). In between, the balancer's own accounting moves it: every byte
// its pool committed since the reading is taken off `available`, every byte
// decommitted is added back. Other processes' use shows at the next reading.
// Before anything is evicted for a new pin, the reading is taken again
// (ensure_budget), so a reused reading only ever says "it fits"; relieve()
// reads afresh too.
MemoryInfo Balancer::memory(bool fresh) {
  const int64_t max_age = probe_.max_age_ns();
  if (max_age <= 0) return probe_.read();
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const size_t committed = pool_.committed_bytes();
  if (!fresh) {
    MutexLock g(probe_mu_);
    if (reading_ns_ != 0 && now - reading_ns_ < max_age) {
      MemoryInfo mi = reading_;
      if (committed >= reading_committed_) {
        const uint64_t d = committed - reading_committed_;
        mi.available = mi.available > d ? mi.available - d : 0;
      } else {
        mi.available = std::min<uint64_t>(mi.available + (reading_committed_ - committed), mi.total);
      }
      return mi;
    }
  }
  const MemoryInfo mi = probe_.read();  // outside probe_mu_: a /proc read
  MutexLock g(probe_mu_);
  if (now >= reading_ns_) {
    reading_ = mi;
    reading_ns_ = now;
    reading_committed_ = committed;
  }
  return mi;
}

// Note [Warm idle memory]
// An evicted pin's memory stays committed (idle extents of the pool) so that
// the next pin reuses it warm: committing and faulting in fresh pages runs at a
// fifth of a copy into warm ones (docs/PERFORMANCE.md, fill). Idle bytes count
// as available to a new pin (ensure_budget), and the pool keeps as many idle
// bytes as the budget lets stay committed: while available RAM stays at or
// above `line`, all of them; below it, it gives back the difference, never
// below the pool's own retain_free. While free_along_tiers() frees for a new
// pin, the pool keeps everything and the line is the pin's own
// (pin_reserve_line): the pin that asked for room reuses it at once. Otherwise
// (after a pin was made, after free() and relieve()) the line is the headroom:
// idle memory never takes available RAM below the RAM-pressure line, where it
// would be memory the page cache could hold, and relieve() gives it back
// before it evicts any pin. A registration ceiling that is hit drops idle
// extents before it drops any pin's page-lock. A reading of no available RAM
// at all gives every idle byte back whatever the line: it cannot say how far
// past the RAM the process is (a new pin the idle extents could not hold was
// committed fresh), and with a line of 0 (headroom:0) nothing else would.
void Balancer::keep_warm(const MemoryInfo& mi, uint64_t line) {
  const uint64_t idle = pool_.idle_bytes();
  const uint64_t room = idle + mi.available;  // available once the idle bytes went back
  const uint64_t warm = mi.available == 0 ? 0 : room > line ? room - line : 0;
  const uint64_t keep = std::max<uint64_t>(pool_.options().retain_free, warm);
  pool_.set_retain_free(static_cast<size_t>(keep));
  if (idle > keep) pool_.trim(static_cast<size_t>(keep));
}

uint64_t Balancer::unreserved_locked(uint64_t available, uint64_t settled_at_read) const {
  // settled_ only grows; a sum past 2^64 cannot be available anyway.
  const uint64_t since = settled_ - settled_at_read;
  const uint64_t unseen = reserved_ > UINT64_MAX - since ? UINT64_MAX : reserved_ + since;
  return available > unseen ? available - unseen : 0;
}

uint64_t Balancer::reserve(size_t bytes, uint64_t available, uint64_t settled_at_read, const Config& c) {
  MutexLock g(mu_);
  const uint64_t shortfall = pin_shortfall(bytes, unreserved_locked(available, settled_at_read), c);
  if (shortfall == 0) reserved_ += bytes;
  return shortfall;
}

bool Balancer::ensure_budget(size_t bytes, Subset target, MemoryInfo& mi, uint64_t settled_at_read) {
  PINS_RANGE("pins::ensure_budget");
  const Config c = config();
  const auto sum = [](uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; };
  // Note [Warm idle memory]: the pool's idle bytes are the new pin's to reuse.
  // Note [Budget reservation]: reserve() admits and reserves under mu_.
  uint64_t room = sum(mi.available, pool_.idle_bytes());
  uint64_t shortfall = reserve(bytes, room, settled_at_read, c);
  if (shortfall == 0) return true;
  // Note [Memory readings]: nothing is evicted on a reused reading.
  mi = memory(/*fresh=*/true);
  room = sum(mi.available, pool_.idle_bytes());
  shortfall = reserve(bytes, room, settled_at_read, c);
  if (shortfall == 0) return true;
  // Note [Pin eviction tiers]: only a streaming pin may take tier 4.
  const Reach reach = is_streaming(target) ? Reach::SpareActive : Reach::SparePromptStreaming;
  const size_t freed = free_along_tiers(pin_free_goal(shortfall, c), reach, pin_reserve_line(c));
  // At least the shortfall freed, counted again against the reservations of now.
  return freed >= shortfall && reserve(bytes, sum(room, freed), settled_at_read, c) == 0;
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
  // Idle extents hold locks no pin needs: they go first (Note [Warm idle memory]).
  if (const size_t idle = pool_.idle_bytes(); idle > 0) {
    const uint64_t over = locked() > goal ? locked() - goal : 0;
    pool_.trim(idle > over ? idle - over : 0);
    if (lock_fits(locked(), bytes, ceiling)) return true;
  }
  std::vector<std::pair<Pin*, void*>> order;
  {
    MutexLock g(mu_);
    const uint64_t now = locked();
    const uint64_t need = now > goal ? now - goal : 0;
    uint64_t got = 0;
    walk_locked(Reach::SpareActive, [&](const Candidate& cand) {
      if (got >= need) return false;
      Pin* p = cand.pin;
      if (p->state != PinState::Live || p->users > 0 || p->block == nullptr || !pool_.is_locked(p->block)) return true;
      p->state = PinState::Evicting;  // held against eviction and reuse while its lock drops
      order.emplace_back(p, p->block);
      got += p->bytes;
      return true;
    });
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

void Balancer::reuse_index_locked(Model& m, Pin* p) {
  m.by_reuse[static_cast<int>(p->subset)].emplace(ReuseHistory::index_key(*p), p);
}

void Balancer::reuse_unindex_locked(Model& m, Pin* p) {
  m.by_reuse[static_cast<int>(p->subset)].erase(ReuseHistory::index_key(*p));
}

void Balancer::set_reuse_indexes_locked(bool on) {
  if (on == reuse_on_) return;
  reuse_on_ = on;
  for (auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s) {
      m->by_reuse[s].clear();
      if (on)
        for (auto& [key, p] : m->pins[s]) reuse_index_locked(*m, p.get());
    }
}

bool Balancer::trace_index_current_locked() const {
  return config_.policy == PolicyKind::Trace && trace_.following() && trace_generation_ == trace_.generation();
}

void Balancer::retrace_locked(const std::vector<TraceKey>& keys) {
  for (const TraceKey& k : keys) {
    auto it = models_.find(k.model);
    if (it == models_.end()) continue;
    Model& m = *it->second;
    for (const Subset s : {streaming_subset(k.kind), cache_subset(k.kind)}) {
      auto p = m.pins[static_cast<int>(s)].find(k.key);
      if (p == m.pins[static_cast<int>(s)].end()) continue;
      trace_unindex(m, p->second.get());
      trace_index(m, p->second.get(), trace_);
    }
  }
}

void Balancer::rebuild_trace_index_locked() {
  clear_trace_index_locked();
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

void Balancer::clear_trace_index_locked() {
  if (trace_generation_ == kNoTraceIndex) return;
  for (auto& [id, m] : models_)
    for (int s = 0; s < kSubsets; ++s) {
      m->by_trace[s].clear();
      for (auto& [key, p] : m->pins[s]) p->trace_indexed = false;
    }
  trace_generation_ = kNoTraceIndex;
}

std::optional<size_t> Balancer::trace_index_faults() const {
  MutexLock g(mu_);
  if (!trace_index_current_locked()) return std::nullopt;
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

void Balancer::walk_locked(Reach reach, const std::function<bool(const Candidate&)>& visit) {
  // Note [Trace index]: the first decision of a generation ranks every pin again.
  if (config_.policy == PolicyKind::Trace && trace_.following() && !trace_index_current_locked())
    rebuild_trace_index_locked();
  walk_eviction_order(models_, reach, config_.policy, trace_, visit, {&reuse_, clock_});  // Note [Eviction walk]
}

size_t Balancer::free_along_tiers(size_t bytes, Reach reach, uint64_t warm_line) {
  PINS_RANGE("pins::free");
  // Note [Warm idle memory]: the pool keeps what is freed below; keep_warm()
  // at the end sets the limit the budget allows.
  pool_.set_retain_free(HostPool::kMaxAllocation);
  // Pins of dead sources are free wins before any tier: a bounded step of the
  // ring (Note [Dead source reclaim]), not a check of every pin, so a decision
  // costs the same with 10^3 pins as with 10^5 (Note [Eviction walk]).
  size_t freed = reclaim(kReclaimPerDecision);
  std::unordered_set<Pin*> skipped;
  while (freed < bytes) {
    std::vector<Candidate> batch;
    {
      MutexLock g(mu_);
      size_t want = bytes - freed, got = 0;
      std::vector<Pin*> busy_now;  // counted below: the walk's visitor touches pins only
      walk_locked(reach, [&](const Candidate& c) {
        Pin* p = c.pin;
        if (skipped.count(p)) return true;
        if (p->users > 0 || p->state != PinState::Live) {
          busy_now.push_back(p);
          skipped.insert(p);
          return true;
        }
        p->state = PinState::Evicting;
        batch.push_back(c);
        got += p->bytes;
        return got < want;
      });
      for (Pin* p : busy_now) stats_locked(*p).inflight_skips++;
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
  // Note [Warm idle memory]: what was freed stays committed for the next pin
  // as far as the budget allows; the rest goes back to the OS now.
  keep_warm(memory(), warm_line);
  return freed;
}

size_t Balancer::free(size_t bytes, bool evict_active) {
  const size_t freed =
      free_along_tiers(bytes, evict_active ? Reach::All : Reach::SpareActive, config().headroom);
  // An explicit request for RAM: short of pins to evict, the pool's idle
  // committed memory goes back too, up to what was asked.
  if (freed < bytes) {
    const size_t rest = bytes - freed, idle = pool_.idle_bytes();
    pool_.trim(idle > rest ? idle - rest : 0);
  }
  return freed;
}

size_t Balancer::relieve() {
  PINS_RANGE("pins::relieve");
  {
    std::vector<void*> dead;
    {
      MutexLock g(mu_);
      reclaim_step_locked(dead, kReclaimPerCall);  // Note [Dead source reclaim]: the monitor's polls reclaim too
    }
    free_blocks(dead);
  }
  MemoryInfo mi = memory(/*fresh=*/true);
  const Config c = config();
  {
    MutexLock g(mu_);
    relieve_calls_++;
  }
  // Note [Warm idle memory]: idle memory goes back before any pin.
  keep_warm(mi, c.headroom);
  mi = memory();
  const uint64_t shortfall = relieve_shortfall(mi.available, c);
  if (shortfall == 0) return 0;
  const size_t freed = free_along_tiers(relieve_free_goal(shortfall, c), Reach::SpareActive, c.headroom);
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

// ------------------------------------------------------------------ Note [Dead source reclaim]

void Balancer::ring_add_locked(Pin* p) {
  p->ring = ring_.size();
  ring_.push_back(p);  // not checked yet this round: after the cursor
}

void Balancer::ring_remove_locked(Pin* p) {
  size_t hole = p->ring;
  PINS_ASSERT(hole < ring_.size() && ring_[hole] == p);
  // Each step moves ring_[from] into the hole and leaves the hole at `from`.
  if (hole < ring_next_) {
    // A checked slot: the last checked pin fills it, so the unchecked ones
    // stay contiguous after the cursor.
    const size_t from = --ring_next_;
    ring_[hole] = ring_[from];
    ring_[hole]->ring = hole;
    hole = from;
  }
  if (const size_t last = ring_.size() - 1; hole != last) {
    ring_[hole] = ring_[last];
    ring_[hole]->ring = hole;
  }
  ring_.pop_back();
  p->ring = SIZE_MAX;
}

size_t Balancer::reclaim_step_locked(std::vector<void*>& to_free, size_t checks) {
  size_t bytes = 0;
  for (size_t n = 0, end = std::min(checks, ring_.size()); n < end && !ring_.empty(); ++n) {
    if (ring_next_ >= ring_.size()) ring_next_ = 0;  // a new round
    Pin* p = ring_[ring_next_];
    if (p->state == PinState::Live && p->guard && !p->guard->alive()) {
      stats_locked(*p).dropped++;
      bytes += p->bytes;
      unlink_locked(p, to_free);  // the next unchecked pin takes its slot
    } else {
      ++ring_next_;
    }
  }
  return bytes;
}

size_t Balancer::reclaim(size_t checks) {
  std::vector<void*> blocks;
  size_t bytes = 0;
  {
    MutexLock g(mu_);
    bytes = reclaim_step_locked(blocks, checks);
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

uint64_t Balancer::reserved_bytes() const {
  MutexLock g(mu_);
  return reserved_;
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
  for (int s = 0; s < kSubsets; ++s) {  // forgotten models' COUNTs and SUMs (levels 0)
    out.subsets[s] += retired_[s];
    out.total += retired_[s];
  }
  out.refusals = refusals_;
  out.busy_misses = busy_misses_;
  for (int b = 0; b < kBypassReasons; ++b) out.bypassed[b] = bypassed_[b];
  out.plain_copies = plain_copies_.load(std::memory_order_relaxed);
  out.pressure_freed_bytes = pressure_freed_;
  out.relieve_calls = relieve_calls_;
  out.trace_departures = trace_.departures();
  out.trace_records = static_cast<int64_t>(trace_.records());
  out.reuse_keys = static_cast<int64_t>(reuse_.keys());
  out.prompt = prompt_;
  return out;
}

}  // namespace pins
