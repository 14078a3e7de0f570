// Note [Shared pins] (host_share.h) on Linux: a process's calls on the index
// once attached (attach_linux.cpp): acquire, publish, release, stats.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "csrc/base/clock.h"
#include "csrc/share/index_linux.h"

namespace pins::share {

Grant HostShare::acquire(const Key& k) {
  Impl& im = *impl_;
  Grant g;
  if (im.pid != getpid()) return g;  // a fork child pins privately
  if (k.length == 0 || k.length > k.size || k.offset > k.size - k.length) return g;
  const int64_t deadline = monotonic_ns() + static_cast<int64_t>(im.wait_ms) * 1'000'000;
  bool waited = false;
  for (;;) {
    im.lock();
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
        e.leases |= uint64_t{1} << im.slot;
        seal(e);
        const uint64_t gen = e.generation;
        im.unlock();
        bool gone = false;
        void* p = im.open_ready(i, gen, k.length, gone);
        if (p == nullptr) {
          im.lock();
          if (im.usable()) {
            Entry& again = im.entry(i);
            if (gone && entry_valid(again) && again.generation == gen && again.state == kReady) im.drop(i);
            else im.drop_lease(i, gen);
          }
          im.unlock();
          im.errors.fetch_add(1, std::memory_order_relaxed);
          return g;
        }
        im.joins.fetch_add(1, std::memory_order_relaxed);
        return Grant{Grant::Kind::Ready, p, k.length, i, gen};
      }
      // Writing: wait for its writer, unless the writer is this process (its
      // own race: the balancer serves it) or dead (its entry goes).
      if (e.writer != im.slot && !im.alive(e.writer)) {
        im.reclaim_slot(e.writer);
        im.dead_slots.fetch_add(1, std::memory_order_relaxed);
        im.unlock();
        continue;
      }
      const bool own = e.writer == im.slot;
      im.unlock();
      if (!waited && !own) im.waits.fetch_add(1, std::memory_order_relaxed);
      waited = true;
      if (own || monotonic_ns() >= deadline) {
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
    e.leases = uint64_t{1} << im.slot;
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
    // /dev/shm is an error here, not a SIGBUS in the fill.
    const int rc = posix_fallocate(s, 0, static_cast<off_t>(round_page(k.length)));
    void* p = rc == 0 ? im.map_segment(s, k.length) : nullptr;
    close(s);
    if (p == nullptr) {
      im.lock();
      if (im.usable()) im.drop_lease(i, gen);
      im.unlock();
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
  im.lock();
  bool ok = false;
  if (im.usable()) {
    Entry& e = im.entry(g.entry);
    if (entry_valid(e) && e.generation == g.generation && e.state == kWriting && e.writer == im.slot) {
      e.state = kReady;
      seal(e);
      ok = true;
    }
  }
  im.unlock();
  if (ok) im.published.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

void HostShare::release(uint32_t entry, uint64_t generation, void* data, uint64_t length) {
  Impl& im = *impl_;
  if (data != nullptr) munmap(data, round_page(length));
  if (im.pid != getpid()) return;
  im.lock();
  if (im.usable()) im.drop_lease(entry, generation);
  im.unlock();
}

ShareStats HostShare::stats() {
  Impl& im = *impl_;
  ShareStats s;
  s.joins = im.joins.load(std::memory_order_relaxed);
  s.fills = im.fills.load(std::memory_order_relaxed);
  s.published = im.published.load(std::memory_order_relaxed);
  s.waits = im.waits.load(std::memory_order_relaxed);
  s.busy = im.busy.load(std::memory_order_relaxed);
  s.refused = im.refused.load(std::memory_order_relaxed);
  s.errors = im.errors.load(std::memory_order_relaxed);
  s.torn = im.torn.load(std::memory_order_relaxed);
  s.dead_slots = im.dead_slots.load(std::memory_order_relaxed);
  if (im.pid != getpid()) return s;
  im.lock();
  if (im.usable()) {
    for (uint32_t i = 0; i < kEntries; ++i) {
      const Entry& e = im.entry(i);
      if (e.state == kEmpty || !entry_valid(e) || (e.state != kWriting && e.state != kReady)) continue;
      s.entries++;
      s.bytes += e.key.length;
    }
    const uint64_t used = im.header().slots_used;
    for (uint32_t sl = 0; sl < kSlots; ++sl)
      if ((used & (uint64_t{1} << sl)) && im.alive(sl)) s.processes++;
  }
  im.unlock();
  return s;
}

}  // namespace pins::share
