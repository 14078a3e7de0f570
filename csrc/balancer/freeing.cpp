// The balancer's freeing: along the eviction tiers for a new pin (within the
// budget of budget.h) or for an explicit request, the RAM-pressure check, and
// the registration ceiling's page-lock drops. Victims are chosen and marked
// under the lock, checked for copies in flight and freed outside it (Note
// [Balancer locking]).
#include <algorithm>
#include <unordered_set>
#include <utility>

#include "csrc/balancer/balancer.h"
#include "csrc/balancer/budget.h"
#include "csrc/base/nvtx.h"
#include "csrc/base/saturate.h"

namespace pins {

bool Balancer::ensure_budget(size_t bytes, const Asker& asker, MemoryInfo& mi, uint64_t settled_at_read,
                             bool in_pool) {
  const Subset target = *asker.target;
  PINS_RANGE("pins::ensure_budget");
  const Config c = config();
  // Note [Warm idle memory]: the pool's idle bytes are the new pin's to reuse.
  // Note [Cap budget]: so is the room under the pool's cap.
  // Note [Budget reservation]: the gate admits and reserves under its lock.
  const auto cap_room = [&] { return in_pool ? gate_.cap_room(bytes) : BudgetGate::CapFigure{}; };
  BudgetGate::Room room{gate_.room(mi), settled_at_read, cap_room()};
  BudgetGate::Shortfall short_of = gate_.reserve(bytes, room, in_pool, c);
  if (short_of.none()) return true;
  if (short_of.ram > 0) {
    // Note [Memory readings]: nothing is evicted on a reused reading.
    mi = gate_.memory(/*fresh=*/true);
    room.available = gate_.room(mi);
    short_of = gate_.reserve(bytes, room, in_pool, c);
    if (short_of.none()) return true;
  }
  // Note [Pin eviction tiers]: only a streaming pin may take tier 4.
  const Reach reach = is_streaming(target) ? Reach::SpareActive : Reach::SparePromptStreaming;
  const uint64_t ram_short = short_of.ram, available = room.available;
  // Note [Cap budget]: what the cap lacks is freed along the same tiers, in
  // one walk with what RAM lacks; no slack, the cap's figures being exact.
  uint64_t goal = std::max<uint64_t>(pin_free_goal(ram_short, c), short_of.cap);
  size_t freed = 0;
  for (;;) {
    const size_t got = free_along_tiers(goal, reach, pin_reserve_line(c), asker);
    freed += got;
    // At least the RAM's shortfall freed, counted again (with the cap's room
    // read afresh) against the reservations of now.
    if (freed < ram_short) return false;
    room.available = add_sat(available, freed);
    room.cap = cap_room();
    short_of = gate_.reserve(bytes, room, in_pool, c);
    if (short_of.none()) return true;
    // Note [Cap budget]: a freed block whose extent holds other pins gives the
    // cap nothing; the next pin in the order goes, one at a time, until one
    // of them leaves its extent idle (or none is left to go).
    if (got == 0 || short_of.ram > 0) return false;
    goal = 1;
  }
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
    const uint64_t over = sub_sat(locked(), goal);
    pool_.trim(idle > over ? idle - over : 0);
    if (lock_fits(locked(), bytes, ceiling)) return true;
  }
  std::vector<std::pair<Pin*, void*>> order;
  {
    MutexLock g(mu_);
    const uint64_t need = sub_sat(locked(), goal);
    uint64_t got = 0;
    table_.walk(Reach::SpareActive, [&](const Candidate& cand) {
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
      if (dropped[j] && !p->orphaned) table_.stats_of(*p).lock_drops++;
      if (p->orphaned) {
        table_.reap_orphan(p, blocks);
      } else {
        p->state = PinState::Live;
      }
    }
  }
  free_blocks(blocks);
  return lock_fits(locked(), bytes, ceiling);
}

size_t Balancer::free_along_tiers(size_t bytes, Reach reach, uint64_t warm_line, const Asker& asker) {
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
      table_.walk(reach, [&](const Candidate& c) {
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
      }, asker);
      for (Pin* p : busy_now) table_.stats_of(*p).inflight_skips++;
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
          table_.reap_orphan(p, blocks);
          continue;
        }
        SubsetStats& st = table_.stats_of(*p);
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
        table_.unlink(p, blocks);
      }
    }
    free_blocks(blocks);
  }
  // Note [Warm idle memory]: what was freed stays committed for the next pin
  // as far as the budget allows; the rest goes back to the OS now.
  gate_.keep_warm(gate_.memory(), warm_line);
  return freed;
}

size_t Balancer::free(size_t bytes, bool evict_active, bool loaded) {
  const Reach reach = loaded ? Reach::SparePromptStreaming : evict_active ? Reach::All : Reach::SpareActive;
  const size_t freed = free_along_tiers(bytes, reach, config().headroom);
  // An explicit request for RAM: short of pins to evict, the pool's idle
  // committed memory goes back too, up to what was asked.
  if (freed < bytes) {
    const size_t rest = bytes - freed, idle = pool_.idle_bytes();
    pool_.trim(idle > rest ? idle - rest : 0);
  }
  return freed;
}

size_t Balancer::relieve() {
  const size_t freed = relieve_to_headroom();
  // Note [Pressure from others]: pins' growth from here on is their own.
  relieved_committed_.store(pool_.committed_bytes());
  relieved_available_.store(gate_.memory().available);
  return freed;
}

size_t Balancer::relieve_to_headroom() {
  PINS_RANGE("pins::relieve");
  reclaim(kReclaimPerCall);  // Note [Dead source reclaim]: the monitor's polls reclaim too
  MemoryInfo mi = gate_.memory(/*fresh=*/true);
  const Config c = config();
  {
    MutexLock g(mu_);
    relieve_calls_++;
  }
  // Note [Warm idle memory]: idle memory goes back before any pin. Under
  // pressure, available RAM goes back to headroom + relieve_slack, idle memory
  // first: the slack kept idle would leave it at the headroom, where another
  // process's next allocation takes it below again before the next check.
  // Note [Pressure from others]: what pins alone took below the headroom,
  // within their slack, is no pressure at a boundary either.
  if (relieve_shortfall(mi.available, c) == 0 || mi.available >= pressure_line()) {
    gate_.keep_warm(mi, c.headroom);
    return 0;
  }
  const uint64_t line = add_sat(c.headroom, c.relieve_slack);
  gate_.keep_warm(mi, line);
  mi = gate_.memory();
  const uint64_t goal = sub_sat(line, mi.available);  // relieve_free_goal() less what idle memory gave
  if (goal == 0) return 0;
  const size_t freed = free_along_tiers(goal, Reach::SpareActive, line);
  MutexLock g(mu_);
  pressure_freed_ += static_cast<int64_t>(freed);
  return freed;
}

uint64_t Balancer::pressure_line() const {
  const uint64_t committed = pool_.committed_bytes();
  // A pin's block commits whole extents, which its admission did not see: one
  // extent past the reserve line is still pins' own.
  const uint64_t reserve_line = sub_sat(reserve_line_.load(), pool_.options().extent_min);
  return pins::pressure_line(sub_sat(committed, relieved_committed_.load()), relieved_available_.load(),
                             headroom_.load(), reserve_line);
}

}  // namespace pins
