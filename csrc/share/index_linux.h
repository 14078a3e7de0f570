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

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "csrc/share/host_share.h"

namespace pins::share {

constexpr char kMagic[8] = {'p', 'i', 'n', 's', 'i', 'd', 'x', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kSlots = 64;
constexpr uint32_t kEntries = 16384;  // a power of two
constexpr uint32_t kMaxProbe = 512;
constexpr int64_t kSweepInterval = 1'000'000'000;  // ns between looks for dead slots in acquire()

enum State : uint32_t { kEmpty = 0, kFree = 1, kWriting = 2, kReady = 3 };

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t slots;
  uint32_t entries;
  uint32_t entry_bytes;
  uint64_t check;            // of the fields above
  uint64_t next_generation;  // one aligned store: never torn
  uint64_t slots_used;       // a bit per slot claimed and not yet seen dead or detached
  uint64_t pad[4];
};

struct Entry {
  uint32_t state;
  uint32_t writer;
  uint64_t generation;
  Key key;
  uint64_t leases;
  uint64_t pad[5];
  uint64_t check;  // of every field above
};
static_assert(sizeof(Entry) == 128);
static_assert(sizeof(Header) == 80);

constexpr size_t kEntriesOffset = 4096;
constexpr size_t kIndexBytes = kEntriesOffset + size_t{kEntries} * sizeof(Entry);

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

struct HostShare::Impl {
  std::mutex mu;  // one thread at a time holds the index lock (OFD locks do not tell threads apart)
  int dir_fd = -1;
  int fd = -1;
  char* base = nullptr;
  uint32_t slot = 0;
  pid_t pid = 0;
  bool detached = false;
  int64_t swept_ns = 0;
  uint64_t wait_ms = 0;
  std::string dir;
  std::atomic<uint64_t> joins{0}, fills{0}, published{0}, waits{0}, busy{0}, refused{0}, errors{0}, torn{0},
      dead_slots{0};

  Header& header() { return *reinterpret_cast<Header*>(base); }
  Entry& entry(uint32_t i) { return reinterpret_cast<Entry*>(base + kEntriesOffset)[i]; }
  bool usable() const;

  // index_lock_linux.cpp. Everything below them runs under the index lock
  // (mu held and the OFD lock on kIndexLockByte).
  void lock();
  void unlock();

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
