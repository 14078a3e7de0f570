// Note [Shared pins] (host_share.h): entries, the slots that hold them (a
// writer, leases), and what the index keeps of a process that died.
#include <fcntl.h>
#include <unistd.h>

#include "csrc/base/clock.h"
#include "csrc/share/index_linux.h"

namespace pins::share {

void HostShare::Impl::drop(uint32_t i) {
  Entry& e = entry(i);
  if (e.state == kWriting || e.state == kReady) unlinkat(dir_fd, segment_name(i, e.generation).c_str(), 0);
  const uint64_t gen = e.generation;
  e = Entry{};
  e.state = kFree;
  e.generation = gen;
  seal(e);
}

void HostShare::Impl::drop_torn(uint32_t i) {
  Entry& e = entry(i);
  e = Entry{};
  e.state = kFree;
  seal(e);
  torn.fetch_add(1, std::memory_order_relaxed);
}

bool HostShare::Impl::holds(const Entry& e, uint32_t s) {
  if (e.state != kWriting && e.state != kReady) return false;
  return (e.state == kWriting && e.writer == s) || e.leases.has(s);
}

void HostShare::Impl::let_go(uint32_t i, uint32_t s) {
  Entry& e = entry(i);
  if (e.state == kWriting && e.writer == s) {
    drop(i);
    return;
  }
  e.leases.remove(s);
  if (e.leases.none()) drop(i);
  else seal(e);
}

void HostShare::Impl::reclaim_slot(uint32_t s) {
  bool tore = false;
  for (uint32_t i = 0; i < kEntries; ++i) {
    Entry& e = entry(i);
    if (e.state == kEmpty && all_zero(e)) continue;
    if (!entry_valid(e)) {
      drop_torn(i);
      tore = true;
      continue;
    }
    if (holds(e, s)) let_go(i, s);
  }
  header().slots_used.remove(s);
  if (tore) sweep_files();
}

bool HostShare::Impl::alive(uint32_t s) { return s == slot ? usable() : held_by_other(fd, slot_byte(s)); }

void HostShare::Impl::sweep_dead() {
  const Slots used = header().slots_used;
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (s == slot || !used.has(s)) continue;
    if (!held_by_other(fd, slot_byte(s))) {
      reclaim_slot(s);
      dead_slots.fetch_add(1, std::memory_order_relaxed);
    }
  }
  swept_ns = monotonic_ns();
}

void HostShare::Impl::drop_lease(uint32_t i, uint64_t gen) {
  if (i >= kEntries) return;
  Entry& e = entry(i);
  if (!entry_valid(e) || e.generation != gen || (e.state != kWriting && e.state != kReady)) return;
  let_go(i, slot);
}

bool HostShare::Impl::publish(uint32_t i, uint64_t gen) {
  if (i >= kEntries) return false;
  Entry& e = entry(i);
  if (!entry_valid(e) || e.generation != gen || e.state != kWriting || e.writer != slot) return false;
  e.state = kReady;
  seal(e);
  return true;
}

uint32_t HostShare::Impl::find(const Key& k, bool& found) {
  const uint32_t start = static_cast<uint32_t>(key_hash(k)) & (kEntries - 1);
  uint32_t room = kEntries;
  found = false;
  for (uint32_t n = 0; n < kMaxProbe; ++n) {
    const uint32_t i = (start + n) & (kEntries - 1);
    Entry& e = entry(i);
    if (!entry_valid(e)) {
      drop_torn(i);
      sweep_files();
    }
    if (e.state == kEmpty) return room != kEntries ? room : i;
    if (e.state == kFree) {
      if (room == kEntries) room = i;
      continue;
    }
    if (e.key == k) {
      found = true;
      return i;
    }
  }
  return room;
}

}  // namespace pins::share
