#include "csrc/balancer/balancer.h"

#include <algorithm>
#include <cstdint>

#include "csrc/balancer/budget.h"
#include "csrc/base/check.h"
#include "csrc/base/nvtx.h"
#include "csrc/base/saturate.h"

namespace pins {

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

void Lease::filled(bool publish) {
  PINS_ASSERT(pin_ != nullptr && fill_, "filled() on a lease that had nothing to fill");
  owner_->mark_filled(pin_, publish);
  fill_ = false;
}

// ------------------------------------------------------------------ Balancer

Balancer::Balancer(const Config& config, HostPool& pool, MemoryProbe& probe)
    : pool_(pool), gate_(pool, probe), config_(config), table_(config.policy) {
  headroom_.store(config.headroom);
  reserve_line_.store(pin_reserve_line(config));
}

Balancer::~Balancer() {
  std::vector<void*> blocks;
  {
    MutexLock g(mu_);
    table_.release_all(blocks);
  }
  free_blocks(blocks);
}

void Balancer::configure(const Config& config) {
  MutexLock g(mu_);
  config_ = config;
  table_.set_policy(config_.policy);
  const uint64_t reserve_line = pin_reserve_line(config);
  const bool headroom_moved = headroom_.exchange(config.headroom) != config.headroom;
  const bool reserve_moved = reserve_line_.exchange(reserve_line) != reserve_line;
  // Note [Pressure from others]: what pins took under another budget is not
  // their slack under this one: the next check measures against the headroom.
  if (headroom_moved || reserve_moved) {
    relieved_committed_.store(pool_.committed_bytes());
    relieved_available_.store(UINT64_MAX);
  }
}

Config Balancer::config() const {
  MutexLock g(mu_);
  return config_;
}

void Balancer::free_blocks(const std::vector<void*>& blocks) {
  for (void* b : blocks)
    if (b != nullptr) pool_.free(b);
}

// ------------------------------------------------------------------ models

ModelId Balancer::register_model(std::string name, std::string load_device, ModelOptions options) {
  MutexLock g(mu_);
  return table_.add_model(std::move(name), std::move(load_device), options);
}

bool Balancer::has_model(ModelId model) const {
  MutexLock g(mu_);
  return table_.has_model(model);
}

void Balancer::forget_model(ModelId model) {
  std::vector<void*> blocks;
  {
    MutexLock g(mu_);
    table_.model(model, "forget_model");
    table_.forget_model(model, blocks);
  }
  free_blocks(blocks);
}

void Balancer::set_active(ModelId model, bool active) {
  MutexLock g(mu_);
  table_.set_active(table_.model(model, "set_active"), active);
}

void Balancer::set_device_bytes(ModelId model, uint64_t bytes, uint64_t total) {
  MutexLock g(mu_);
  table_.model(model, "set_device_bytes").on_device = Model::OnDevice{std::min(bytes, total), total};
}

// ------------------------------------------------------------------ prompts

void Balancer::mark_prompt(const std::vector<ModelId>& models) {
  MutexLock g(mu_);
  for (ModelId id : models) table_.model(id, "mark_prompt");  // all or nothing
  if (!prompt_) table_.start_prompt();
  prompt_ = true;
  for (ModelId id : models) {
    Model& m = table_.model(id, "mark_prompt");
    if (!m.in_prompt) m.prompt_peak = held_bytes(m);  // Note [Prewarm]: its peak in this prompt starts here
    m.in_prompt = true;
  }
  table_.mark_prompt(models);
}

namespace {
// At a node or prompt boundary the `patches` pins go, but for those an
// eviction holds: the eviction frees them.
bool droppable_patch(const Pin& p) { return p.state != PinState::Evicting; }
}  // namespace

void Balancer::end_node() {
  PINS_RANGE("pins::end_node");
  std::vector<void*> blocks;
  {
    MutexLock g(mu_);
    for (auto& [id, m] : table_.models()) {
      m->active = false;
      table_.drop_if(*m, Subset::Patches, droppable_patch, blocks);
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
    table_.end_prompt();  // before the marks go: Note [Idle cache pins]
    for (auto& [id, m] : table_.models()) {
      if (m->in_prompt) m->last_prompt_peak = m->prompt_peak;  // Note [Prewarm]
      m->in_prompt = false;
      table_.drop_if(*m, Subset::Patches, droppable_patch, blocks);
    }
  }
  free_blocks(blocks);
}

// ------------------------------------------------------------------ staleness

size_t Balancer::invalidate(uint64_t storage, uint64_t offset, uint64_t span) {
  PINS_RANGE("pins::invalidate");
  std::vector<void*> blocks;
  size_t bytes = 0;
  {
    MutexLock g(mu_);
    bytes = table_.drop_overlapping(storage, offset, add_sat(offset, span), blocks);
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
    Model& m = table_.model(model, "invalidate_model");
    for (int s = 0; s < kSubsets; ++s)
      bytes += table_.drop_if(m, static_cast<Subset>(s), [](const Pin&) { return true; }, blocks,
                              /*invalidated=*/true);
  }
  free_blocks(blocks);
  return bytes;
}

// ------------------------------------------------------------------ Note [Dead source reclaim]

size_t Balancer::reclaim(size_t checks) {
  std::vector<void*> blocks;
  size_t bytes = 0;
  {
    MutexLock g(mu_);
    bytes = table_.reclaim(checks, blocks);
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
    for (auto& [id, m] : table_.models())
      for (int s = 0; s < kSubsets; ++s) bytes += table_.drop_if(*m, static_cast<Subset>(s), dead, blocks);
  }
  free_blocks(blocks);
  return bytes;
}

void Balancer::set_reuse_future(ReuseHistory::Future future) {
  MutexLock g(mu_);
  table_.set_reuse_future(std::move(future));
}

// ------------------------------------------------------------------ stats

SubsetStats Balancer::subset_stats(ModelId model, Subset s) const {
  MutexLock g(mu_);
  return table_.model(model, "subset_stats").stats[static_cast<int>(s)];
}

std::vector<Balancer::PinInfo> Balancer::pins() const {
  MutexLock g(mu_);
  std::vector<PinInfo> out;
  table_.for_each_pin([&](const Pin& p) {
    out.push_back({p.model, p.subset, p.key, p.bytes, p.block != nullptr && pool_.is_locked(p.block)});
  });
  return out;
}

std::optional<size_t> Balancer::trace_index_faults() const {
  MutexLock g(mu_);
  return table_.trace_index_faults();
}

BalancerStats Balancer::stats() const {
  MutexLock g(mu_);
  BalancerStats out;
  table_.collect(out);
  out.plain_copies = plain_copies_.load(std::memory_order_relaxed);
  out.pressure_freed_bytes = pressure_freed_;
  out.relieve_calls = relieve_calls_;
  out.prompt = prompt_;
  return out;
}

}  // namespace pins
