// The balancer's cast path (DESIGN.md "Choosing and creating a pin"): lookup()
// finds a pin that serves the cast, admit() makes room for a new one and
// allocates its block, create() links it and leases it for its fill. Only
// lookup() and create() take the balancer's lock; admit() runs outside it
// (Note [Balancer locking]).
#include <utility>

#include "csrc/balancer/balancer.h"
#include "csrc/files/mapped.h"

namespace pins {

Lease Balancer::acquire(const Request& r, const MakeGuard& make_guard) {
  std::vector<void*> stale;
  Lookup found = lookup(r, stale);
  if (found.lease) {
    // Outside mu_: Note [Changed files] may make a syscall, Note [Content check] reads the source.
    const SourceChange change = found.lease.change(found.content_check);
    if (change != SourceChange::None) found = look_again(r, std::move(found), change, stale);
  }
  free_blocks(stale);  // stale pins dropped by either lookup, dead ones by the reclaim step
  if (found.served) return std::move(found.lease);
  const Admitted admitted = admit(r, found.target, found.settled_at_read);
  if (admitted.block == nullptr) return {};
  return create(r, found.target, found.reuse_gap, admitted, make_guard ? make_guard(found.content_check) : nullptr);
}

Balancer::Lookup Balancer::lookup(const Request& r, std::vector<void*>& stale, bool again) {
  Lookup out;
  MutexLock g(mu_);
  Model& m = table_.model(r.model, r.op);
  if (r.bytes == 0) {
    table_.bypass(r.model, Bypass::Empty);
    out.served = true;  // an empty lease: nothing to pin
    return out;
  }
  if (!again) table_.reclaim(kReclaimPerCall, stale);  // Note [Dead source reclaim]
  out.settled_at_read = gate_.settled();
  out.content_check = config_.content_check;
  if (!again) out.reuse_gap = table_.record_access(m, r);
  // DESIGN.md: the streaming subset first, then an existing -loaded pin,
  // whatever the mode.
  Pin* p = table_.lookup(m, streaming_subset(r.kind), r, stale);
  if (p == nullptr) p = table_.lookup(m, cache_subset(r.kind), r, stale);
  if (p == nullptr) {
    const bool cache_allowed = !config_.fast_disk && !m.options.fast_disk && config_.policy != PolicyKind::Lru;
    out.target = target_subset(r.kind, r.resident, r.signature.has_value(), cache_allowed);
    SubsetStats& st = m.stats[static_cast<int>(out.target)];
    st.misses++;
    st.miss_bytes += static_cast<int64_t>(r.bytes);
    return out;
  }
  out.served = true;
  SubsetStats& st = m.stats[static_cast<int>(p->subset)];
  if (p->state == PinState::Live && p->block != nullptr && !pool_.begin_copy(p->block)) {
    // Note [Copies from a block]: its extent's page-lock is being dropped.
    table_.bypass(r.model, Bypass::Unlocking);
  } else if (p->state == PinState::Live) {
    st.hits++;
    st.hit_bytes += static_cast<int64_t>(p->bytes);
    p->users++;
    table_.touch(m, p, out.reuse_gap);
    out.lease = Lease(this, p, /*hit=*/true, /*fill=*/false);
    return out;
  } else {
    // Still being filled or evicted by another thread: serve from the source.
    table_.busy_miss(r.model);
  }
  st.misses++;
  st.miss_bytes += static_cast<int64_t>(r.bytes);
  return out;
}

Balancer::Lookup Balancer::look_again(const Request& r, Lookup stale_hit, SourceChange change,
                                      std::vector<void*>& stale) {
  Pin* p = stale_hit.lease.pin_;
  {
    MutexLock g(mu_);
    if (!p->orphaned) {  // else its model was forgotten meanwhile: nothing to take back
      SubsetStats& st = table_.stats_of(*p);
      st.hits--;  // the cast did not hit after all: lookup() below counts what it is
      st.hit_bytes -= static_cast<int64_t>(p->bytes);
      st.dropped++;
      if (change == SourceChange::Content) st.content_mismatches++;
      table_.unlink(p, stale);  // leased: detached, freed when the lease lets go
    }
  }
  stale_hit.lease = Lease();
  Lookup out = lookup(r, stale, /*again=*/true);
  out.reuse_gap = stale_hit.reuse_gap;
  return out;
}

share::Grant Balancer::share_grant(const Request& r) {
  share::Key key;
  if (share_ == nullptr || r.data == nullptr || !r.parts.empty() || !files::share_key_of(r.data, r.bytes, key))
    return {};
  return share_->acquire(key);
}

void* Balancer::adopt(const share::Grant& g, bool lock) {
  const size_t page = pool_.backend().page_size();
  const size_t size = static_cast<size_t>((g.length + page - 1) / page * page);
  // Runs once no copy reads the block (Note [Adopted blocks], csrc/pool/pool.h).
  auto release = [share = share_, entry = g.entry, gen = g.generation, data = g.data, length = g.length] {
    share->release(entry, gen, data, length);
  };
  try {
    return pool_.adopt(g.data, size, lock, release);
  } catch (...) {
    release();  // not adopted: the grant goes back here
    throw;
  }
}

Balancer::Admitted Balancer::admit(const Request& r, Subset target, uint64_t settled_at_read) {
  Admitted out;
  // Note [Shared pins]: a segment another process filled adds no RAM: it
  // takes no budget, only the page-lock's room.
  out.grant = share_grant(r);
  // One reading of system memory serves both checks: freeing changes what is
  // available, not the total and swap the ceiling depends on.
  MemoryInfo mi = gate_.memory();
  const auto lock_for = [&] { return !pool_.backend().can_lock() || ensure_lock_room(r.bytes, mi); };
  if (out.grant.kind == share::Grant::Kind::Ready) {
    out.block = adopt(out.grant, lock_for());
    return out;
  }
  // Reserves r.bytes. Note [Cap budget]: a shared segment's block is no pool commit.
  const bool budget = ensure_budget(r.bytes, Asker{r.model, target, &r.key}, mi, settled_at_read, !out.grant);
  if (budget) {
    const bool lock = lock_for();
    out.block = out.grant ? adopt(out.grant, lock) : pool_.try_allocate(r.bytes, lock, /*budgeted=*/true);
    gate_.keep_warm(gate_.memory(), config().headroom);  // what the reuse above left idle
    // Note [Budget reservation]: the pool accounts for the block now.
    gate_.settle(r.bytes, out.block != nullptr, /*in_pool=*/!out.grant);
  } else {
    // Note [Warm idle memory]: refused, the pin's source goes through the page
    // cache; what the walk freed for it is no pin's, held to the headroom's line.
    gate_.keep_warm(gate_.memory(), config().headroom);
    if (out.grant) {
      share_->release(out.grant.entry, out.grant.generation, out.grant.data, out.grant.length);  // never filled
      out.grant = {};
    }
  }
  if (out.block == nullptr) {
    MutexLock g(mu_);
    table_.bypass(r.model, budget ? Bypass::Pool : Bypass::Refused);
  }
  return out;
}

Lease Balancer::create(const Request& r, Subset target, uint64_t reuse_gap, const Admitted& admitted,
                       std::unique_ptr<SourceGuard> guard) {
  void* const block = admitted.block;
  Lease l;
  {
    MutexLock g(mu_);
    Model* m = table_.find_model(r.model);
    // Forgotten meanwhile, or another thread pinned the same source: copy from
    // the source (the block goes back to the pool below, outside mu_).
    if (m == nullptr) {
      table_.bypass(r.model, Bypass::Forgotten);
    } else if (table_.holds(*m, r.kind, r.key)) {
      table_.bypass(r.model, Bypass::Raced);
    } else if (!pool_.begin_copy(block)) {
      // Note [Copies from a block]: the block's extent is losing its page-lock.
      table_.bypass(r.model, Bypass::Unlocking);
    } else {
      Pin* p = table_.create(*m, r, target, block, reuse_gap, std::move(guard));
      // Note [Shared pins]: a Ready segment holds its bytes already.
      const bool ready = admitted.grant.kind == share::Grant::Kind::Ready;
      if (admitted.grant) {
        p->shared = true;
        p->share_publish = !ready;
        p->share_entry = admitted.grant.entry;
        p->share_generation = admitted.grant.generation;
      }
      if (ready) p->state = PinState::Live;
      l = Lease(this, p, /*hit=*/false, /*fill=*/!ready);
    }
  }
  if (!l) pool_.free(block);
  return l;
}

void Balancer::mark_filled(Pin* p, bool publish_it) {
  share::Grant publish;
  {
    MutexLock g(mu_);
    if (p->state == PinState::Filling) p->state = PinState::Live;
    if (p->share_publish) {
      publish.kind = share::Grant::Kind::Write;
      publish.entry = p->share_entry;
      publish.generation = p->share_generation;
      p->share_publish = false;
    }
  }
  // Note [Shared pins]: after the fill, every process may map it, unless the
  // fill may not hold the key's bytes. The lease holds the pin (and its
  // block), so the segment is not released meanwhile.
  if (publish && publish_it) share_->publish(publish);
  else if (publish) share_->withdraw(publish);
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
      if (p->users == 0) table_.reap_orphan(p, blocks);
    } else if (p->state == PinState::Filling && p->users == 0) {
      // Dropped before filled(): the pin holds garbage.
      table_.stats_of(*p).dropped++;
      table_.unlink(p, blocks);
    }
  }
  free_blocks(blocks);
}

}  // namespace pins
