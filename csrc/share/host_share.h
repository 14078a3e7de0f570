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
// without reading or hashing the file. A segment holds the file's bytes as
// they were under that stamp, so a process takes a key only while its file
// has not changed since it mapped it (looked at with fstat at each new shared
// pin, Note [Changed files]), and a writer publishes its fill only when the
// file is still unchanged after it (else the segment is withdrawn): sharing
// never serves bytes the same process would not serve without it. Each
// process page-locks its own mapping of it (the pool adopts it: Note [Adopted
// blocks]), a registration the size of one pin, as for private pins. What is
// not shared: a source not backed
// by a file (a patched weight, a LoRA factor, a model built in RAM), a source
// whose pages were written through the mapping, a gathered pin; other hosts.
//
// The index. One file, `index`, in the same directory, mapped MAP_SHARED: a
// header, a table of process slots and an open-addressed table of entries
// (probed from the key's hash). Every read and write of it happens under the
// *index lock*, an OFD lock on byte 0 of the index file: one process at a
// time looks up, creates, publishes, releases or evicts, and no take of it
// waits longer than lock_wait_ms (Note [Bounded index lock], index_lock_linux.cpp). An
// entry is Empty, Free (a tombstone: probes go on past it), Writing (one
// process fills its segment) or Ready; its generation, drawn from a counter in
// the header, names its segment file (seg-<entry>-<generation>), so a name is
// never reused. A writer publishes Ready only after its fill: nobody maps an
// entry before it is Ready (a reader of a Writing entry waits, outside the
// lock, or copies from its source past share_wait). Each entry carries a
// checksum of its fields, the header one of its own: an entry that fails it
// (a process killed in the middle of an update, a stray write) or whose
// fields make no sense together is dropped, and its segment, named by nobody
// then, is removed with every other file of the directory no valid entry
// names. Nothing read from the index is used before its check passed: an
// index whose header fails is rebuilt. The checksum is not a signature: an
// entry a process of the same user wrote with a correct checksum is believed
// (see Security). The index's pages, as a segment's, are reserved
// (posix_fallocate) before one is touched: a full tmpfs is a refusal, never a
// SIGBUS, and a fresh index that gets no room is removed.
//
// Leases and liveness. A process claims a slot (256 in all) by holding an OFD
// lock on the slot's own byte of the index file for its life: the kernel
// drops it when the process dies, however it dies, so a peer tells a live
// slot from a dead one by asking (F_OFD_GETLK), not by trusting a pid. An
// entry's leases are a bit per slot: a process holds its bit while one of its
// pins maps the segment. A dead slot's bits are cleared, and its Writing
// entries dropped, by the next process that looks (at attach, detach, a wait on
// its Writing entry, and once a second in acquire()). So what processes that
// died (kill -9, os._exit) leave holds RAM in tmpfs until a live process of the
// same directory looks, or, when none is left, until the next attach
// (`python -m torch_pins share --clean` is one).
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
// naming it, its owner and mode: a process of another user can neither read
// nor write the share. The threat model stops there: processes of the same
// user are trusted, with the segments' bytes and with the index alike, as
// they can write the segments or ptrace each other anyway (one that
// truncates a segment another maps makes the reader fault). The index is
// checked so that nothing in it (a torn update, garbage, a forged entry)
// makes a process crash or map a file that is not a segment of the right
// size; a forged entry with a correct checksum and sound fields is served, as
// a forged segment would be. A keyed checksum would change nothing: its key
// would sit in a file the same user can read.
//
// When sharing fails. attach() fails (AttachError, a reason word and a
// message naming the path) when the directory cannot be made or used
// (missing, read-only, another user's or open to others: a local user can
// create <root>/pins-<uid> first, which is why share_dir may name a directory
// of the user's own, such as $XDG_RUNTIME_DIR), when share_dir is not on a
// filesystem in RAM (tmpfs, ramfs: elsewhere the segments would be written to
// disk), when the tmpfs has no room for the index, when all slots are taken,
// and when the index lock stays held past lock_wait_ms. The runtime then pins
// privately, prints one warning and reports share_state 0 with the reason in
// stats(): sharing is an optimisation, and every op works without it.
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

#include "csrc/base/check.h"

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
  uint64_t lock_timeouts = 0;  // takes of the index lock past lock_wait_ms (Note [Bounded index lock])
  uint64_t withdrawn = 0;   // fills not published: the file changed during the fill (Note [Shared pins])
  // The host's, as the index said at the call.
  uint64_t entries = 0;     // Writing and Ready entries
  uint64_t bytes = 0;       // their lengths, each segment once
  uint32_t processes = 0;   // live slots
};

struct ShareOptions {
  std::string root = "/dev/shm";  // the directory is <root>/pins-<uid>
  uint64_t wait_ms = 10000;       // how long acquire() waits for another process's fill
  uint64_t lock_wait_ms = 1000;   // how long any call waits for the index lock (Note [Bounded index lock])
};

// Why attach() could not attach (Note [Shared pins], "When sharing fails"):
// the message names the path and the cause; `reason` is one word for stats:
// directory (cannot be made or opened: missing, read-only), owner (another
// user's, open to others, not a directory), filesystem (not in RAM), space
// (no room for the index), slots (kSlots processes attached), lock (the index
// lock held past lock_wait_ms), platform (not Linux).
struct AttachError : ResourceError {
  AttachError(const char* why, const std::string& what) : ResourceError(what), reason(why) {}
  const char* reason;
};

class HostShare {
 public:
  // Attaches to the host's index, creating the directory and the index when
  // absent. AttachError naming the path and the cause when the directory or
  // index is another user's or open to others, cannot be made, is not on a
  // filesystem in RAM, or has no room; when 256 processes are attached
  // already; when the index lock stays held past lock_wait_ms; on any system
  // but Linux. pins::ValueError for an empty root.
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
  // stays this process's, released as any other; false too when the index
  // lock was not had in time, the publish then made at the next take.
  bool publish(const Grant& grant);
  // A Write grant whose fill is not the key's bytes (the file changed during
  // it): its entry goes, never Ready; the mapping stays this process's.
  void withdraw(const Grant& grant);
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
