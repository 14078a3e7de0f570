// Note [Shared pins] (host_share.h) on Linux, private to csrc/share/*_linux.cpp:
// the index file's format and HostShare::Impl, whose parts live in
//   index_format_linux.cpp  the format's checks: checksums, an entry's sense, the header
//   index_lock_linux.cpp    the index lock and the slots' liveness locks (OFD locks)
//   slots_linux.cpp         slots, leases, and what a dead process leaves
//   segments_linux.cpp      segment files: named, mapped, swept
//   attach_linux.cpp        attach, detach, exit and fork
//   host_share_linux.cpp    acquire, publish, release, stats
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "csrc/share/host_share.h"

namespace pins::share {

constexpr char kMagic[8] = {'p', 'i', 'n', 's', 'i', 'd', 'x', '1'};
// 2: 256 slots, a lease bitmap of four words (1: 64 slots, one word). An index
// of another version is rebuilt (header_ok() fails), the size stays.
constexpr uint32_t kVersion = 2;
constexpr uint32_t kSlots = 256;
constexpr uint32_t kSlotWords = kSlots / 64;
constexpr uint32_t kEntries = 16384;  // a power of two
constexpr uint32_t kMaxProbe = 512;
constexpr int64_t kSweepInterval = 1'000'000'000;  // ns between looks for dead slots in acquire()

enum State : uint32_t { kEmpty = 0, kFree = 1, kWriting = 2, kReady = 3 };

// A bit per slot.
struct Slots {
  uint64_t w[kSlotWords];
  bool has(uint32_t s) const { return (w[s / 64] >> (s % 64)) & 1; }
  void add(uint32_t s) { w[s / 64] |= uint64_t{1} << (s % 64); }
  void remove(uint32_t s) { w[s / 64] &= ~(uint64_t{1} << (s % 64)); }
  bool none() const {
    for (uint64_t x : w)
      if (x != 0) return false;
    return true;
  }
};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t slots;
  uint32_t entries;
  uint32_t entry_bytes;
  uint64_t check;            // of the fields above
  uint64_t next_generation;  // one aligned store: never torn
  Slots slots_used;          // the slots claimed and not yet seen dead or detached
};

struct Entry {
  uint32_t state;
  uint32_t writer;
  uint64_t generation;
  Key key;
  Slots leases;
  uint64_t pad[2];
  uint64_t check;  // of every field above
};
static_assert(sizeof(Entry) == 128);
static_assert(sizeof(Header) == 72);

constexpr size_t kEntriesOffset = 4096;
constexpr size_t kIndexBytes = kEntriesOffset + size_t{kEntries} * sizeof(Entry);  // 2 MiB + 4 KiB

// ---- the format (index_format_linux.cpp)
uint64_t hash_bytes(const void* p, size_t n, uint64_t salt);
uint64_t header_check(const Header& h);
void seal(Entry& e);
bool all_zero(const Entry& e);
// Whether an entry may be believed: a fresh (zeroed) one, or one whose fields
// pass their checksum and make sense together.
bool entry_valid(const Entry& e);
// The name of entry idx's segment file in generation gen.
std::string segment_name(uint32_t idx, uint64_t gen);
std::string errno_text(int err);
size_t page_size();
uint64_t round_page(uint64_t n);

// ---- locks (index_lock_linux.cpp)
bool ofd_lock(int fd, short type, off_t byte, bool wait);
// Whether another open file description holds a lock on `byte`.
bool held_by_other(int fd, off_t byte);
constexpr off_t kIndexLockByte = 0;
inline off_t slot_byte(uint32_t s) { return 1 + static_cast<off_t>(s); }

// ---- files (segments_linux.cpp)
// Reserves the pages of [0, length) of the file: 0 or an errno (ENOSPC when
// the filesystem is full). posix_fallocate, or the test's seam (share_testing.h).
int reserve_file(int fd, off_t length);
// Note [Shared pins], "Where the share lives": whether the filesystem of fd
// keeps its files in RAM (tmpfs, ramfs); `type` names it for a message.
bool in_ram(int fd, std::string* type);

struct HostShare::Impl {
  // One thread at a time holds the index lock (OFD locks do not tell threads
  // apart); timed, so a thread waiting behind another's bounded wait is bounded too.
  std::timed_mutex mu;
  int dir_fd = -1;
  int fd = -1;
  char* base = nullptr;
  uint32_t slot = 0;
  pid_t pid = 0;
  bool detached = false;
  int64_t swept_ns = 0;
  uint64_t wait_ms = 0;
  int64_t lock_wait_ns = 0;
  std::string dir;
  std::atomic<uint64_t> joins{0}, fills{0}, published{0}, waits{0}, busy{0}, refused{0}, errors{0}, torn{0},
      dead_slots{0}, lock_timeouts{0}, withdrawn{0};
  // Note [Bounded index lock]: a wait ran out, so the next take tries once
  // and waits no more until one succeeds.
  std::atomic<bool> stuck{false};
  // Updates of the index that could not take the lock in time, made at the
  // next take that can (pending_mu is a leaf: taken under mu or not at all).
  struct Pending {
    bool publish;  // else drop this slot's lease (or own Writing entry)
    uint32_t entry;
    uint64_t generation;
  };
  std::mutex pending_mu;
  std::vector<Pending> pending;
  // The host's figures as the last stats() under the lock saw them.
  std::atomic<uint64_t> last_entries{0}, last_bytes{0};
  std::atomic<uint32_t> last_processes{0};
  // Per writer slot, until when this process serves its Writing entries from
  // the source at once: it gave up waiting for one (Note [Bounded index lock]).
  std::array<std::atomic<int64_t>, kSlots> stalled_until{};

  Header& header() { return *reinterpret_cast<Header*>(base); }
  Entry& entry(uint32_t i) { return reinterpret_cast<Entry*>(base + kEntriesOffset)[i]; }
  bool usable() const;

  // index_lock_linux.cpp. Takes the index lock (mu and the OFD lock on
  // kIndexLockByte) within lock_wait_ns (at once when stuck), then makes the
  // pending updates: true. False, counted in lock_timeouts and nothing held,
  // when the wait ran out. Everything below runs under it.
  bool lock();
  void unlock();
  void defer(Pending p);
  void apply_pending();

  // slots_linux.cpp
  void drop(uint32_t i);
  // A torn entry: its segment (if any) is named by nobody now; sweep_files() removes it.
  void drop_torn(uint32_t i);
  // Whether slot s holds the valid entry e: its writer, or a lease.
  static bool holds(const Entry& e, uint32_t s);
  // Slot s lets go of the valid Writing or Ready entry i: its own Writing
  // entry goes (never published: nobody else maps it), else its lease, and
  // the entry with the last one.
  void let_go(uint32_t i, uint32_t s);
  // Clears a dead slot's leases and drops its Writing entries.
  void reclaim_slot(uint32_t s);
  bool alive(uint32_t s);
  void sweep_dead();
  void drop_lease(uint32_t i, uint64_t gen);
  // This slot's Writing entry i of generation gen becomes Ready.
  bool publish(uint32_t i, uint64_t gen);
  // Probes for `k`: its entry, or (found false) where a new one goes
  // (kEntries when the probe found no room).
  uint32_t find(const Key& k, bool& found);

  // index_format_linux.cpp
  void init_index();
  bool header_ok();

  // segments_linux.cpp
  // Removes every file of the directory no valid Writing or Ready entry names.
  void sweep_files();
  void* map_segment(int seg_fd, uint64_t length);
  // Opens and maps a Ready entry's segment (its lease held, so it stays).
  // `gone`: the segment's file is not there (removed by hand): the entry goes.
  void* open_ready(uint32_t i, uint64_t gen, uint64_t length, bool& gone);
};

}  // namespace pins::share
