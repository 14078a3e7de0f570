// Pins shared by every process of a host (torch-free). Linux: csrc/share/*_linux.cpp
// (index_linux.h lists them); Windows: host_share_win.cpp.
//
// Note [Shared pins]
// A host that runs one process per GPU pins the same weights once per
// process. With `share:true` (PINS_CONF), a pin of a file-backed source whose
// pages were never written (Note [File-backed pins]) lives in a *segment*: a
// file in a directory of the user's own, <share_dir>/pins-<uid> (share_dir is
// /dev/shm unless set), mapped MAP_SHARED by every process that pins the same
// bytes. A segment is keyed by the file's identity as fstat tells it (device,
// inode, size, mtime, ctime) and the byte range, so a second process finds it
// without reading or hashing the file. A segment holds one tensor: each
// process page-locks its own mapping of it (the pool adopts it: Note [Adopted
// blocks]), a registration the size of one pin, as for private pins. What is
// not shared: a source not backed
// by a file (a patched weight, a LoRA factor, a model built in RAM), a source
// whose pages were written through the mapping, a gathered pin; other hosts.
//
// The index. One file, `index`, in the same directory, mapped MAP_SHARED: a
// header, a table of process slots and an open-addressed table of entries
// (probed from the key's hash). Every read and write of it happens under the
// *index lock*, an OFD lock (fcntl F_OFD_SETLKW) on byte 0 of the index file:
// one process at a time looks up, creates, publishes, releases or evicts. An
// entry is Empty, Free (a tombstone: probes go on past it), Writing (one
// process fills its segment) or Ready; its generation, drawn from a counter in
// the header, names its segment file (seg-<entry>-<generation>), so a name is
// never reused. A writer publishes Ready only after its fill: nobody maps an
// entry before it is Ready (a reader of a Writing entry waits, outside the
// lock, or copies from its source past share_wait). Each entry carries a
// checksum of its fields, the header one of its own: an entry that fails it
// (a process killed in the middle of an update, or a peer writing garbage) is
// dropped, and its segment, named by nobody then, is removed with every other
// file of the directory no valid entry names. Nothing read from the index is
// used before its check passed: an index whose header fails is rebuilt.
//
// Leases and liveness. A process claims a slot (64 in all) by holding an OFD
// lock on the slot's own byte of the index file for its life: the kernel
// drops it when the process dies, however it dies, so a peer tells a live
// slot from a dead one by asking (F_OFD_GETLK), not by trusting a pid. An
// entry's leases are a bit per slot: a process holds its bit while one of its
// pins maps the segment. A dead slot's bits are cleared, and its Writing
// entries dropped, by the next process that looks (at attach, detach, a wait on
// its Writing entry, and once a second in acquire()).
//
// Eviction and the budget. An entry lives while a process leases it: when the
// last lease goes, its segment is unlinked and its RAM returns to the system
// once the last mapping is gone. A process's lease goes when the pool retires
// the pin's block: at once on a free with no copy in flight, else at the
// pool's next reap after the copy's fence is done (its next allocation or trim). So there is no unleased entry to evict, and a
// process evicts only its own pins, along its own tiers, under the balancer's
// budget: the budget reads the host's available memory, which the segments
// (shmem) lower for every process alike, so one watermark holds for the sum of
// all processes' pins. Joining a Ready entry adds no RAM and takes no budget.
// A process's own figures (pool stats, the balancer's bytes) count a joined
// segment in full; the index's `bytes` counts each segment once. So does a
// free: dropping a pin whose segment another process leases frees no RAM yet,
// and the pressure monitor's recheck (20 ms on) frees more where it must; the
// prewarm's estimate of a prompt's new pins does not know which of them a
// peer holds already.
//
// Security. The directory is created 0700 and every file in it 0600, opened
// relative to the directory with O_NOFOLLOW; a directory or file that is not
// the process's user's own, or is open to others, is refused with an error
// naming it, its owner and mode: a process of another user cannot attach.
// Same-user processes are trusted with the segments' bytes, as they can
// ptrace each other anyway (one that truncates a segment another maps makes
// the reader fault); the index is checked, never trusted.
//
// Crash safety. A kill -9 anywhere leaves the other processes serving correct
// bytes: an entry is mapped only Ready, a Writing entry of a dead writer is
// dropped, a torn entry is dropped, a mapping stays valid after its file is
// unlinked. The last process to detach removes every file and the directory;
// if the last one was killed, the next attach cleans up after it. A fork child
// does not share (its slot lock is its parent's): it pins privately.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace pins::share {

// A byte range of a file as it is on disk now.
struct Key {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Key&) const = default;
};

// What acquire() hands out.
struct Grant {
  enum class Kind {
    None,   // no shared pin: busy past the wait, the index full, no RAM for the segment, an error
    Ready,  // a mapping of a filled segment: serve it as is
    Write,  // a mapping of a new segment, leased for its fill: fill it, then publish()
  };
  Kind kind = Kind::None;
  void* data = nullptr;  // page-aligned; `length` bytes of the key, mapped rounded up to the page
  uint64_t length = 0;
  uint32_t entry = 0;
  uint64_t generation = 0;
  explicit operator bool() const { return kind != Kind::None; }
};

struct ShareStats {
  // This process's, never decreasing.
  uint64_t joins = 0;       // Ready entries mapped: pins not read from disk
  uint64_t fills = 0;       // Write grants: segments this process filled
  uint64_t published = 0;   // of them, published Ready
  uint64_t waits = 0;       // acquire() calls that waited for another process's fill
  uint64_t busy = 0;        // gave up waiting (share_wait): served from the source
  uint64_t refused = 0;     // the index full, or no room for the segment
  uint64_t errors = 0;      // a segment that could not be created or mapped
  uint64_t torn = 0;        // entries dropped because they failed their check
  uint64_t dead_slots = 0;  // slots of dead processes reclaimed
  // The host's, as the index said at the call.
  uint64_t entries = 0;     // Writing and Ready entries
  uint64_t bytes = 0;       // their lengths, each segment once
  uint32_t processes = 0;   // live slots
};

struct ShareOptions {
  std::string root = "/dev/shm";  // the directory is <root>/pins-<uid>
  uint64_t wait_ms = 10000;       // how long acquire() waits for another process's fill
};

class HostShare {
 public:
  // Attaches to the host's index, creating the directory and the index when
  // absent. pins::ResourceError or pins::ValueError naming the path when the
  // directory or index is another user's or open to others, or cannot be
  // made; pins::ResourceError when 64 processes are attached already. Linux
  // only: elsewhere a pins::ValueError.
  static std::shared_ptr<HostShare> attach(const ShareOptions& options);
  ~HostShare();  // detach()
  HostShare(const HostShare&) = delete;
  HostShare& operator=(const HostShare&) = delete;

  // The shared pin of `key` (key.length > 0), mapped: Ready to serve, or Write
  // to fill and publish. Never throws for a state of the index: what it
  // cannot do is a Grant of Kind::None, counted.
  Grant acquire(const Key& key);
  // A Write grant's segment holds its bytes: Ready for every process. False
  // when its entry was dropped meanwhile (a peer found it torn): the mapping
  // stays this process's, released as any other.
  bool publish(const Grant& grant);
  // Unmaps a grant's mapping and drops its lease: the last lease of an entry
  // (or a Write grant never published) frees the entry and unlinks its
  // segment. Call it once no copy reads the mapping.
  void release(uint32_t entry, uint64_t generation, void* data, uint64_t length);

  // Drops this process's leases and slot; the last process removes every
  // file and the directory. Mappings stay valid. Idempotent; runs at exit.
  void detach();

  ShareStats stats();
  const std::string& dir() const { return dir_; }

  struct Impl;

 private:
  HostShare(std::unique_ptr<Impl> impl, std::string dir);
  std::unique_ptr<Impl> impl_;
  const std::string dir_;
};

// The hash the index probes from; tests use it to make keys collide.
uint64_t key_hash(const Key& key);

}  // namespace pins::share
