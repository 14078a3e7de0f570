// Note [Shared pins] (host_share.h) on Linux: a process's calls on the index
// once attached (attach_linux.cpp): acquire, publish, withdraw, release, stats.
// Each takes the index lock within its bound (Note [Bounded index lock] in
// index_lock_linux.cpp) or does without it.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "csrc/base/clock.h"
#include "csrc/share/index_linux.h"

namespace pins::share {
namespace {

// Drops this slot's lease of entry i (or its own Writing entry) now, or at
// the next take of the index lock when it cannot be had in time.
void let_go_or_defer(HostShare::Impl& im, uint32_t i, uint64_t gen) {
  if (!im.lock()) {
    im.defer({/*publish=*/false, i, gen});
    return;
  }
  if (im.usable()) im.drop_lease(i, gen);
  im.unlock();
}

}  // namespace

Grant HostShare::acquire(const Key& k) {
  Impl& im = *impl_;
  Grant g;
  if (im.pid != getpid()) return g;  // a fork child pins privately
  if (k.length == 0 || k.length > k.size || k.offset > k.size - k.length) return g;
  const int64_t deadline = monotonic_ns() + static_cast<int64_t>(im.wait_ms) * 1'000'000;
  bool waited = false;
  for (;;) {
    if (!im.lock()) return g;  // counted in lock_timeouts: pinned privately
    if (!im.usable()) {
      im.unlock();
      return g;
    }
    if (monotonic_ns() - im.swept_ns >= kSweepInterval) im.sweep_dead();
    bool found = false;
    const uint32_t i = im.find(k, found);
    if (found) {
      Entry& e = im.entry(i);
      if (e.state == kReady) {
        e.leases.add(im.slot);
        seal(e);
        const uint64_t gen = e.generation;
        im.unlock();
        bool gone = false;
        void* p = im.open_ready(i, gen, k.length, gone);
        if (p == nullptr) {
          if (!im.lock()) {
            im.defer({/*publish=*/false, i, gen});
          } else {
            if (im.usable()) {
              Entry& again = im.entry(i);
              if (gone && entry_valid(again) && again.generation == gen && again.state == kReady) im.drop(i);
              else im.drop_lease(i, gen);
            }
            im.unlock();
          }
          im.errors.fetch_add(1, std::memory_order_relaxed);
          return g;
        }
        im.joins.fetch_add(1, std::memory_order_relaxed);
        return Grant{Grant::Kind::Ready, p, k.length, i, gen};
      }
      // Writing: wait for its writer, unless the writer is this process (its
      // own race: the balancer serves it), dead (its entry goes), or one this
      // process gave up waiting for lately (Note [Bounded index lock]).
      if (e.writer != im.slot && !im.alive(e.writer)) {
        im.reclaim_slot(e.writer);
        im.dead_slots.fetch_add(1, std::memory_order_relaxed);
        im.unlock();
        continue;
      }
      const uint32_t writer = e.writer;
      const bool own = writer == im.slot;
      im.unlock();
      if (!waited && !own) im.waits.fetch_add(1, std::memory_order_relaxed);
      waited = true;
      const int64_t now = monotonic_ns();
      if (own || now >= deadline || now < im.stalled_until[writer]) {
        if (!own && now >= deadline) im.stalled_until[writer] = now + static_cast<int64_t>(im.wait_ms) * 1'000'000;
        im.busy.fetch_add(1, std::memory_order_relaxed);
        return g;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (i == kEntries) {
      im.unlock();
      im.refused.fetch_add(1, std::memory_order_relaxed);
      return g;
    }
    Entry& e = im.entry(i);
    const uint64_t gen = ++im.header().next_generation;
    e = Entry{};
    e.state = kWriting;
    e.writer = im.slot;
    e.generation = gen;
    e.key = k;
    e.leases.add(im.slot);
    seal(e);
    const int s = openat(im.dir_fd, segment_name(i, gen).c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                         0600);
    if (s < 0) {
      im.drop(i);
      im.unlock();
      im.errors.fetch_add(1, std::memory_order_relaxed);
      return g;
    }
    im.unlock();
    // The segment's pages are reserved before its mapping is written: a full
    // tmpfs is a refusal here (the pin is made privately), not a SIGBUS in the fill.
    const int rc = reserve_file(s, static_cast<off_t>(round_page(k.length)));
    void* p = rc == 0 ? im.map_segment(s, k.length) : nullptr;
    close(s);
    if (p == nullptr) {
      let_go_or_defer(im, i, gen);
      (rc == ENOSPC || rc == ENOMEM ? im.refused : im.errors).fetch_add(1, std::memory_order_relaxed);
      return g;
    }
    im.fills.fetch_add(1, std::memory_order_relaxed);
    return Grant{Grant::Kind::Write, p, k.length, i, gen};
  }
}

bool HostShare::publish(const Grant& g) {
  Impl& im = *impl_;
  if (im.pid != getpid()) return false;
  if (g.kind != Grant::Kind::Write || g.entry >= kEntries) return false;
  if (!im.lock()) {
    im.defer({/*publish=*/true, g.entry, g.generation});
    return false;
  }
  const bool ok = im.usable() && im.publish(g.entry, g.generation);
  im.unlock();
  if (ok) im.published.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

void HostShare::withdraw(const Grant& g) {
  Impl& im = *impl_;
  if (im.pid != getpid() || g.kind != Grant::Kind::Write || g.entry >= kEntries) return;
  im.withdrawn.fetch_add(1, std::memory_order_relaxed);
  let_go_or_defer(im, g.entry, g.generation);  // its own Writing entry: dropped, its segment unlinked
}

void HostShare::release(uint32_t entry, uint64_t generation, void* data, uint64_t length) {
  Impl& im = *impl_;
  if (data != nullptr) munmap(data, round_page(length));
  if (im.pid != getpid()) return;
  let_go_or_defer(im, entry, generation);
}

ShareStats HostShare::stats() {
  Impl& im = *impl_;
  ShareStats s;
  if (im.pid == getpid() && im.lock()) {  // first: the take makes pending updates, which the counters then count
    if (im.usable()) {
      uint64_t entries = 0, bytes = 0;
      uint32_t processes = 0;
      for (uint32_t i = 0; i < kEntries; ++i) {
        const Entry& e = im.entry(i);
        if (e.state == kEmpty || !entry_valid(e) || (e.state != kWriting && e.state != kReady)) continue;
        entries++;
        bytes += e.key.length;
      }
      const Slots used = im.header().slots_used;
      for (uint32_t sl = 0; sl < kSlots; ++sl)
        if (used.has(sl) && im.alive(sl)) processes++;
      im.last_entries = entries;
      im.last_bytes = bytes;
      im.last_processes = processes;
    }
    im.unlock();
  }
  s.joins = im.joins.load(std::memory_order_relaxed);
  s.fills = im.fills.load(std::memory_order_relaxed);
  s.published = im.published.load(std::memory_order_relaxed);
  s.waits = im.waits.load(std::memory_order_relaxed);
  s.busy = im.busy.load(std::memory_order_relaxed);
  s.refused = im.refused.load(std::memory_order_relaxed);
  s.errors = im.errors.load(std::memory_order_relaxed);
  s.torn = im.torn.load(std::memory_order_relaxed);
  s.dead_slots = im.dead_slots.load(std::memory_order_relaxed);
  s.withdrawn = im.withdrawn.load(std::memory_order_relaxed);
  s.lock_timeouts = im.lock_timeouts.load(std::memory_order_relaxed);
  if (im.pid != getpid()) return s;  // a fork child: the index is its parent's
  // Past the lock's bound: the host's figures as last seen.
  s.entries = im.last_entries;
  s.bytes = im.last_bytes;
  s.processes = im.last_processes;
  return s;
}

}  // namespace pins::share
