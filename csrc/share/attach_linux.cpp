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
    throw ValueError(detail::cat("share: ", path, " is not a ", dir ? "directory" : "regular file",
                                 "; pins shares only through a directory of its own"));
  if (st.st_uid != me || (st.st_mode & 077) != 0)
    throw ResourceError(detail::cat("share: ", path, " belongs to uid ", st.st_uid, " with mode ", std::oct,
                                    (st.st_mode & 07777), std::dec, "; this process runs as uid ", me,
                                    " and shares only through files of its own user, mode 0700/0600"));
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

}  // namespace pins::share
