// Note [Shared pins] (host_share.h) on Linux: the index, its locks, segments.
#include "csrc/share/host_share.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"

namespace pins::share {
namespace {

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

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

uint64_t hash_bytes(const void* p, size_t n, uint64_t salt) {
  uint64_t h = salt;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = 0;
    std::memcpy(&v, b + i, std::min<size_t>(8, n - i));
    h = mix(h, v);
  }
  return h;
}

uint64_t header_check(const Header& h) { return hash_bytes(&h, offsetof(Header, check), 0x68647231); }
uint64_t entry_check(const Entry& e) { return hash_bytes(&e, offsetof(Entry, check), 0x656e7431); }

void seal(Entry& e) { e.check = entry_check(e); }

bool all_zero(const Entry& e) {
  const auto* b = reinterpret_cast<const unsigned char*>(&e);
  for (size_t i = 0; i < sizeof e; ++i)
    if (b[i] != 0) return false;
  return true;
}

// Whether an entry may be believed: a fresh (zeroed) one, or one whose fields
// pass their checksum and make sense together.
bool entry_valid(const Entry& e) {
  if (e.state == kEmpty) return all_zero(e);
  if (e.check != entry_check(e)) return false;
  if (e.state == kFree) return true;
  if (e.state != kWriting && e.state != kReady) return false;
  return e.writer < kSlots && e.key.length > 0 && e.key.length <= e.key.size &&
         e.key.offset <= e.key.size - e.key.length;
}

std::string segment_name(uint32_t idx, uint64_t gen) {
  return "seg-" + std::to_string(idx) + "-" + std::to_string(gen);
}

std::string errno_text(int err) { return std::strerror(err); }

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
uint64_t round_page(uint64_t n) { return (n + page_size() - 1) & ~(uint64_t{page_size()} - 1); }

// Refuses a directory or file that is not this user's own or is open to others.
void check_owned(const struct stat& st, const std::string& path, bool dir) {
  const uid_t me = geteuid();
  if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
    throw ValueError(detail::cat("share: ", path, " is not a ", dir ? "directory" : "regular file",
                                 "; pins shares only through a directory of its own"));
  if (st.st_uid != me || (st.st_mode & 077) != 0)
    throw ResourceError(detail::cat("share: ", path, " belongs to uid ", st.st_uid, " with mode ", std::oct,
                                    (st.st_mode & 07777), std::dec, "; this process runs as uid ", me,
                                    " and shares only through files of its own user, mode 0700/0600"));
}

bool ofd_lock(int fd, short type, off_t byte, bool wait) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  for (;;) {
    if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return true;
    if (errno == EINTR) continue;
    return false;
  }
}

// Whether another open file description holds a lock on `byte`.
bool held_by_other(int fd, off_t byte) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;  // cannot tell: assume alive (never drops a live lease)
  return fl.l_type != F_UNLCK;
}

constexpr off_t kIndexLockByte = 0;
off_t slot_byte(uint32_t s) { return 1 + static_cast<off_t>(s); }

}  // namespace

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
  bool usable() const { return !detached && pid == getpid(); }

  // ---- under the index lock (mu held and the OFD lock on kIndexLockByte)

  void lock() {
    mu.lock();
    if (fd < 0) return;  // detached: nothing of the index is touched
    while (!ofd_lock(fd, F_WRLCK, kIndexLockByte, true)) {
      // EDEADLK and the like cannot happen for one byte locked by one description; retry after a beat.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void unlock() {
    if (fd >= 0) ofd_lock(fd, F_UNLCK, kIndexLockByte, false);
    mu.unlock();
  }

  void drop(uint32_t i) {
    Entry& e = entry(i);
    if (e.state == kWriting || e.state == kReady) unlinkat(dir_fd, segment_name(i, e.generation).c_str(), 0);
    const uint64_t gen = e.generation;
    e = Entry{};
    e.state = kFree;
    e.generation = gen;
    seal(e);
  }

  // A torn entry: its segment (if any) is named by nobody now; sweep_files() removes it.
  void drop_torn(uint32_t i) {
    Entry& e = entry(i);
    e = Entry{};
    e.state = kFree;
    seal(e);
    torn.fetch_add(1, std::memory_order_relaxed);
  }

  // Removes every file of the directory no valid Writing or Ready entry names.
  void sweep_files() {
    const int d = dup(dir_fd);
    if (d < 0) return;
    DIR* dp = fdopendir(d);
    if (dp == nullptr) {
      close(d);
      return;
    }
    rewinddir(dp);
    std::vector<std::string> doomed;
    while (const dirent* de = readdir(dp)) {
      const std::string name = de->d_name;
      if (name.rfind("seg-", 0) != 0) continue;
      unsigned long long idx = 0, gen = 0;
      char tail = 0;
      bool keep = false;
      if (std::sscanf(name.c_str(), "seg-%llu-%llu%c", &idx, &gen, &tail) == 2 && idx < kEntries) {
        const Entry& e = entry(static_cast<uint32_t>(idx));
        keep = entry_valid(e) && (e.state == kWriting || e.state == kReady) && e.generation == gen &&
               segment_name(static_cast<uint32_t>(idx), gen) == name;
      }
      if (!keep) doomed.push_back(name);
    }
    closedir(dp);
    for (const std::string& n : doomed) unlinkat(dir_fd, n.c_str(), 0);
  }

  // Whether slot s holds the valid entry e: its writer, or a lease.
  static bool holds(const Entry& e, uint32_t s) {
    if (e.state != kWriting && e.state != kReady) return false;
    return (e.state == kWriting && e.writer == s) || (e.leases & (uint64_t{1} << s)) != 0;
  }

  // Slot s lets go of the valid Writing or Ready entry i: its own Writing
  // entry goes (never published: nobody else maps it), else its lease, and
  // the entry with the last one.
  void let_go(uint32_t i, uint32_t s) {
    Entry& e = entry(i);
    if (e.state == kWriting && e.writer == s) {
      drop(i);
      return;
    }
    e.leases &= ~(uint64_t{1} << s);
    if (e.leases == 0) drop(i);
    else seal(e);
  }

  // Clears a dead slot's leases and drops its Writing entries.
  void reclaim_slot(uint32_t s) {
    const uint64_t bit = uint64_t{1} << s;
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
    header().slots_used &= ~bit;
    if (tore) sweep_files();
  }

  bool alive(uint32_t s) { return s == slot ? usable() : held_by_other(fd, slot_byte(s)); }

  void sweep_dead() {
    const uint64_t used = header().slots_used;
    for (uint32_t s = 0; s < kSlots; ++s) {
      if (s == slot || !(used & (uint64_t{1} << s))) continue;
      if (!held_by_other(fd, slot_byte(s))) {
        reclaim_slot(s);
        dead_slots.fetch_add(1, std::memory_order_relaxed);
      }
    }
    swept_ns = monotonic_ns();
  }

  void init_index() {
    std::memset(base, 0, kIndexBytes);
    Header& h = header();
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.slots = kSlots;
    h.entries = kEntries;
    h.entry_bytes = sizeof(Entry);
    h.check = header_check(h);
    // Generations go on from where a rebuilt index's may have been: the clock
    // keeps new names clear of any left behind.
    h.next_generation = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    sweep_files();
  }

  bool header_ok() {
    const Header& h = header();
    return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.version == kVersion && h.slots == kSlots &&
           h.entries == kEntries && h.entry_bytes == sizeof(Entry) && h.check == header_check(h);
  }

  // Probes for `k`: its entry, or (found false) where a new one goes
  // (kEntries when the probe found no room).
  uint32_t find(const Key& k, bool& found) {
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

  void* map_segment(int seg_fd, uint64_t length) {
    void* p = mmap(nullptr, round_page(length), PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  // Opens and maps a Ready entry's segment (its lease held, so it stays).
  // `gone`: the segment's file is not there (removed by hand): the entry goes.
  void* open_ready(uint32_t i, uint64_t gen, uint64_t length, bool& gone) {
    const int s = openat(dir_fd, segment_name(i, gen).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    gone = s < 0 && errno == ENOENT;
    if (s < 0) return nullptr;
    struct stat st {};
    void* p = nullptr;
    if (fstat(s, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 077) == 0 &&
        static_cast<uint64_t>(st.st_size) >= round_page(length))
      p = map_segment(s, length);
    close(s);
    return p;
  }

  void drop_lease(uint32_t i, uint64_t gen) {
    if (i >= kEntries) return;
    Entry& e = entry(i);
    if (!entry_valid(e) || e.generation != gen || (e.state != kWriting && e.state != kReady)) return;
    let_go(i, slot);
  }
};

namespace {

std::mutex g_live_mu;
std::vector<std::weak_ptr<HostShare>>& live_shares() {
  static auto* v = new std::vector<std::weak_ptr<HostShare>>;  // never destroyed: used at exit
  return *v;
}
std::vector<HostShare::Impl*>& live_impls() {
  static auto* v = new std::vector<HostShare::Impl*>;
  return *v;
}

void detach_all_at_exit() {
  std::vector<std::shared_ptr<HostShare>> all;
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    for (auto& w : live_shares())
      if (auto s = w.lock()) all.push_back(std::move(s));
  }
  for (auto& s : all) s->detach();
}

// A fork child closes its copies of the descriptors: the slot's lock stays
// its parent's alone (it goes when the parent's descriptor closes), and the
// child never touches the index.
void close_in_child() {
  for (HostShare::Impl* im : live_impls()) {
    if (im->fd >= 0) close(im->fd);
    if (im->dir_fd >= 0) close(im->dir_fd);
    im->fd = -1;
    im->dir_fd = -1;
    im->detached = true;  // and usable() is false by the pid, before any lock is taken
  }
}

void register_live(const std::shared_ptr<HostShare>& s, HostShare::Impl* im) {
  static const bool once = [] {
    std::atexit(detach_all_at_exit);
    pthread_atfork(nullptr, nullptr, close_in_child);
    return true;
  }();
  (void)once;
  std::lock_guard<std::mutex> g(g_live_mu);
  auto& v = live_shares();
  v.erase(std::remove_if(v.begin(), v.end(), [](const std::weak_ptr<HostShare>& w) { return w.expired(); }),
          v.end());
  v.push_back(s);
  live_impls().push_back(im);
}

void unregister_live(HostShare::Impl* im) {
  std::lock_guard<std::mutex> g(g_live_mu);
  auto& v = live_impls();
  v.erase(std::remove(v.begin(), v.end(), im), v.end());
}

}  // namespace

uint64_t key_hash(const Key& k) { return hash_bytes(&k, sizeof k, 0x6b657931); }

HostShare::HostShare(std::unique_ptr<Impl> impl, std::string dir) : impl_(std::move(impl)), dir_(std::move(dir)) {}

HostShare::~HostShare() {
  detach();
  unregister_live(impl_.get());
}

std::shared_ptr<HostShare> HostShare::attach(const ShareOptions& options) {
  PINS_CHECK_VALUE(!options.root.empty(), "share: share_dir must name a directory, got ''");
  const std::string dir = options.root + "/pins-" + std::to_string(geteuid());
  for (int attempt = 0;; ++attempt) {
    // The last process may remove the directory between any two steps here:
    // each such step starts over (a few times, then the error stands).
    const bool last_try = attempt >= 16;
    auto im = std::make_unique<Impl>();
    im->dir = dir;
    im->pid = getpid();
    im->wait_ms = options.wait_ms;
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      throw ResourceError(detail::cat("share: cannot create ", dir, ": ", errno_text(errno)));
    im->dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (im->dir_fd < 0) {
      if (errno == ENOENT && !last_try) continue;
      throw ResourceError(detail::cat("share: cannot open ", dir, ": ", errno_text(errno)));
    }
    struct stat st {};
    if (fstat(im->dir_fd, &st) != 0)
      throw ResourceError(detail::cat("share: cannot stat ", dir, ": ", errno_text(errno)));
    const auto close_all = [&] {
      if (im->base != nullptr) munmap(im->base, kIndexBytes);
      if (im->fd >= 0) close(im->fd);
      close(im->dir_fd);
      im->base = nullptr;
      im->fd = im->dir_fd = -1;
    };
    try {
      check_owned(st, dir, /*dir=*/true);
    } catch (...) {
      close_all();
      throw;
    }
    const std::string index_path = dir + "/index";
    im->fd = openat(im->dir_fd, "index", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (im->fd < 0) {
      const int err = errno;
      close_all();
      if (err == ENOENT && !last_try) continue;
      throw ResourceError(detail::cat("share: cannot open ", index_path, ": ", errno_text(err)));
    }
    if (fstat(im->fd, &st) != 0) {
      close_all();
      throw ResourceError(detail::cat("share: cannot stat ", index_path));
    }
    try {
      check_owned(st, index_path, /*dir=*/false);
    } catch (...) {
      close_all();
      throw;
    }
    im->mu.lock();
    while (!ofd_lock(im->fd, F_WRLCK, kIndexLockByte, true)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Still the index the directory names? The last process may have removed it.
    struct stat now {};
    if (fstatat(im->dir_fd, "index", &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != st.st_ino ||
        now.st_dev != st.st_dev) {
      im->unlock();
      close_all();
      if (last_try) throw ResourceError(detail::cat("share: ", index_path, " keeps being replaced"));
      continue;
    }
    const bool fresh = static_cast<size_t>(st.st_size) != kIndexBytes;
    if (fresh && (ftruncate(im->fd, 0) != 0 || ftruncate(im->fd, static_cast<off_t>(kIndexBytes)) != 0)) {
      const int err = errno;
      im->unlock();
      close_all();
      throw ResourceError(detail::cat("share: cannot size ", index_path, ": ", errno_text(err)));
    }
    void* p = mmap(nullptr, kIndexBytes, PROT_READ | PROT_WRITE, MAP_SHARED, im->fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      im->unlock();
      close_all();
      throw ResourceError(detail::cat("share: cannot map ", index_path, ": ", errno_text(err)));
    }
    im->base = static_cast<char*>(p);
    if (fresh || !im->header_ok()) im->init_index();
    // A slot: one whose byte no live process holds.
    bool claimed = false;
    for (uint32_t s = 0; s < kSlots && !claimed; ++s) {
      if (!ofd_lock(im->fd, F_WRLCK, slot_byte(s), false)) continue;
      im->slot = s;
      if (im->header().slots_used & (uint64_t{1} << s)) {
        im->reclaim_slot(s);  // its last holder died
        im->dead_slots.fetch_add(1, std::memory_order_relaxed);
      }
      claimed = true;
    }
    if (!claimed) {
      im->unlock();
      close_all();
      throw ResourceError(detail::cat("share: ", kSlots, " processes share ", dir,
                                      " already; this one pins privately (share:false)"));
    }
    im->header().slots_used |= uint64_t{1} << im->slot;
    im->sweep_dead();
    im->sweep_files();
    im->unlock();
    Impl* raw = im.get();
    std::shared_ptr<HostShare> out(new HostShare(std::move(im), dir));
    register_live(out, raw);
    return out;
  }
}

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

void HostShare::detach() {
  Impl& im = *impl_;
  if (im.pid != getpid()) return;  // a fork child: the index is its parent's
  im.lock();
  if (!im.usable()) {
    im.unlock();
    return;
  }
  for (uint32_t i = 0; i < kEntries; ++i) {
    const Entry& e = im.entry(i);
    if (entry_valid(e) && Impl::holds(e, im.slot)) im.let_go(i, im.slot);
  }
  im.header().slots_used &= ~(uint64_t{1} << im.slot);
  im.sweep_dead();
  if (im.header().slots_used == 0) {
    // The last one out: every file goes, then the directory.
    for (uint32_t i = 0; i < kEntries; ++i) {
      Entry& e = im.entry(i);
      if (entry_valid(e) && (e.state == kWriting || e.state == kReady)) im.drop(i);
    }
    std::memset(im.base, 0, sizeof(Header));  // a process holding the old index rebuilds
    im.sweep_files();
    unlinkat(im.dir_fd, "index", 0);
    rmdir(im.dir.c_str());
  }
  im.detached = true;
  ofd_lock(im.fd, F_UNLCK, slot_byte(im.slot), false);
  ofd_lock(im.fd, F_UNLCK, kIndexLockByte, false);
  munmap(im.base, kIndexBytes);
  im.base = nullptr;
  close(im.fd);  // under mu: no other thread reads fd meanwhile
  close(im.dir_fd);
  im.fd = im.dir_fd = -1;
  im.mu.unlock();
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
