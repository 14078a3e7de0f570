// Note [Shared pins] (host_share.h): attaching to the host's index (the
// directory and the index made or checked, a slot claimed), detaching (the
// last process out removes everything), and both at exit and across fork().
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/share/index_linux.h"

namespace pins::share {
namespace {

// Refuses a directory or file that is not this user's own or is open to others.
void check_owned(const struct stat& st, const std::string& path, bool dir) {
  const uid_t me = geteuid();
  if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
    throw AttachError("owner", detail::cat("share: ", path, " is not a ", dir ? "directory" : "regular file",
                                           "; pins shares only through a directory of its own"));
  if (st.st_uid != me || (st.st_mode & 077) != 0)
    throw AttachError("owner", detail::cat("share: ", path, " belongs to uid ", st.st_uid, " with mode ", std::oct,
                                           (st.st_mode & 07777), std::dec, "; this process runs as uid ", me,
                                           " and shares only through files of its own user, mode 0700/0600"));
}

[[noreturn]] void fail(const char* reason, const std::string& what) {
  throw AttachError(reason, "share: " + what);
}

std::string not_in_ram(const std::string& path, const std::string& type) {
  return detail::cat(path, " is on ", type, ", not tmpfs: shared segments there would be written to disk; set "
                     "share_dir to a tmpfs such as /dev/shm");
}

// Note [Shared pins], where the share lives: refused before anything is made
// on a filesystem that is not in RAM.
void check_in_ram(const std::string& root) {
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("directory", detail::cat("cannot open share_dir ", root, ": ", errno_text(errno)));
  std::string type;
  const bool ram = in_ram(fd, &type);
  close(fd);
  if (!ram) fail("filesystem", not_in_ram(root, type));
}

// What attach() opened, closed again unless it succeeds.
struct Opening {
  explicit Opening(HostShare::Impl& im) : im(im) {}
  ~Opening() {
    if (done) return;
    if (im.base != nullptr) munmap(im.base, kIndexBytes);
    if (locked) im.unlock();
    if (im.fd >= 0) close(im.fd);
    if (im.dir_fd >= 0) close(im.dir_fd);
    if (remove_dir) rmdir(im.dir.c_str());  // only when empty
  }
  HostShare::Impl& im;
  bool locked = false, remove_dir = false, done = false;
};

// Unmaps and closes the index: this process is out of it from here on.
void close_index(HostShare::Impl& im) {
  im.detached = true;
  if (im.base != nullptr) munmap(im.base, kIndexBytes);
  im.base = nullptr;
  if (im.fd >= 0) close(im.fd);  // under mu: no other thread reads fd meanwhile
  if (im.dir_fd >= 0) close(im.dir_fd);
  im.fd = im.dir_fd = -1;
}

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

HostShare::HostShare(std::unique_ptr<Impl> impl, std::string dir) : impl_(std::move(impl)), dir_(std::move(dir)) {}

HostShare::~HostShare() {
  detach();
  unregister_live(impl_.get());
}

std::shared_ptr<HostShare> HostShare::attach(const ShareOptions& options) {
  PINS_CHECK_VALUE(!options.root.empty(), "share: share_dir must name a directory, got ''");
  const std::string dir = options.root + "/pins-" + std::to_string(geteuid());
  check_in_ram(options.root);  // before anything is made there
  for (int attempt = 0;; ++attempt) {
    // The last process may remove the directory between any two steps here:
    // each such step starts over (a few times, then the error stands).
    const bool last_try = attempt >= 16;
    auto im = std::make_unique<Impl>();
    im->dir = dir;
    im->pid = getpid();
    im->wait_ms = options.wait_ms;
    im->lock_wait_ns = static_cast<int64_t>(options.lock_wait_ms) * 1'000'000;
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      fail("directory", detail::cat("cannot create ", dir, ": ", errno_text(errno)));
    Opening open(*im);  // closes what it opened unless attach succeeds
    im->dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (im->dir_fd < 0) {
      if (errno == ENOENT && !last_try) continue;
      fail(errno == ELOOP || errno == ENOTDIR ? "owner" : "directory",
           detail::cat("cannot open ", dir, ": ", errno_text(errno)));
    }
    struct stat st {};
    if (fstat(im->dir_fd, &st) != 0) fail("directory", detail::cat("cannot stat ", dir, ": ", errno_text(errno)));
    check_owned(st, dir, /*dir=*/true);
    std::string type;
    if (!in_ram(im->dir_fd, &type)) fail("filesystem", not_in_ram(dir, type));
    const std::string index_path = dir + "/index";
    im->fd = openat(im->dir_fd, "index", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (im->fd < 0) {
      const int err = errno;
      if (err == ENOENT && !last_try) continue;
      fail(err == ELOOP ? "owner" : "directory", detail::cat("cannot open ", index_path, ": ", errno_text(err)));
    }
    if (fstat(im->fd, &st) != 0) fail("directory", detail::cat("cannot stat ", index_path));
    check_owned(st, index_path, /*dir=*/false);
    // Note [Bounded index lock]: a peer stopped while it holds the lock keeps
    // this process from sharing, not from working.
    if (!im->lock())
      fail("lock", detail::cat(index_path, " stayed locked by another process for ", options.lock_wait_ms,
                               " ms (a process stopped or frozen while it held it?)"));
    open.locked = true;
    // Still the index the directory names? The last process may have removed it.
    struct stat now {};
    if (fstatat(im->dir_fd, "index", &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != st.st_ino ||
        now.st_dev != st.st_dev) {
      if (last_try) fail("directory", detail::cat(index_path, " keeps being replaced"));
      continue;
    }
    const bool fresh = static_cast<size_t>(st.st_size) != kIndexBytes;
    if (fresh && (ftruncate(im->fd, 0) != 0 || ftruncate(im->fd, static_cast<off_t>(kIndexBytes)) != 0))
      fail("directory", detail::cat("cannot size ", index_path, ": ", errno_text(errno)));
    // Note [Shared pins], a full tmpfs: the index's pages are reserved before
    // one is touched, as a segment's are; a fresh index that gets no room goes
    // (no process uses it yet), and the directory with it when empty.
    if (const int err = reserve_file(im->fd, static_cast<off_t>(kIndexBytes)); err != 0) {
      if (fresh) {
        unlinkat(im->dir_fd, "index", 0);
        open.remove_dir = true;
      }
      fail(err == ENOSPC ? "space" : "directory",
           detail::cat("cannot reserve the ", kIndexBytes, " bytes of ", index_path, ": ", errno_text(err),
                       err == ENOSPC ? detail::cat(" (", options.root, " is full)") : std::string()));
    }
    void* p = mmap(nullptr, kIndexBytes, PROT_READ | PROT_WRITE, MAP_SHARED, im->fd, 0);
    if (p == MAP_FAILED) fail("directory", detail::cat("cannot map ", index_path, ": ", errno_text(errno)));
    im->base = static_cast<char*>(p);
    if (fresh || !im->header_ok()) im->init_index();
    // A slot: one whose byte no live process holds.
    bool claimed = false;
    for (uint32_t s = 0; s < kSlots && !claimed; ++s) {
      if (!ofd_lock(im->fd, F_WRLCK, slot_byte(s), false)) continue;
      im->slot = s;
      if (im->header().slots_used.has(s)) {
        im->reclaim_slot(s);  // its last holder died
        im->dead_slots.fetch_add(1, std::memory_order_relaxed);
      }
      claimed = true;
    }
    if (!claimed) fail("slots", detail::cat(kSlots, " processes share ", dir, " already"));
    im->header().slots_used.add(im->slot);
    im->sweep_dead();
    im->sweep_files();
    im->unlock();
    open.locked = false;
    open.done = true;
    Impl* raw = im.get();
    std::shared_ptr<HostShare> out(new HostShare(std::move(im), dir));
    register_live(out, raw);
    return out;
  }
}

void HostShare::detach() {
  Impl& im = *impl_;
  if (im.pid != getpid()) return;  // a fork child: the index is its parent's
  if (!im.lock()) {
    // Note [Bounded index lock]: the index is closed all the same, which
    // drops this slot's lock; the next process that looks reclaims the slot.
    // On the system clock, as in Impl::lock() (ThreadSanitizer).
    std::unique_lock<std::timed_mutex> g(im.mu, std::chrono::system_clock::now() +
                                                    std::chrono::nanoseconds(im.lock_wait_ns));
    if (!g.owns_lock() || !im.usable()) return;  // another thread of this process is stuck too: exit closes it
    close_index(im);
    return;
  }
  if (!im.usable()) {
    im.unlock();
    return;
  }
  for (uint32_t i = 0; i < kEntries; ++i) {
    const Entry& e = im.entry(i);
    if (entry_valid(e) && Impl::holds(e, im.slot)) im.let_go(i, im.slot);
  }
  im.header().slots_used.remove(im.slot);
  im.sweep_dead();
  if (im.header().slots_used.none()) {
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
  ofd_lock(im.fd, F_UNLCK, slot_byte(im.slot), false);
  ofd_lock(im.fd, F_UNLCK, kIndexLockByte, false);
  close_index(im);
  im.mu.unlock();
}

}  // namespace pins::share
