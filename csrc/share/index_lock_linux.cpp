// Note [Shared pins] (host_share.h): the locks on the index file. The index
// lock (byte 0) serializes every read and write of the index; each slot's byte
// is held by its process for its life, so the kernel tells a dead one.
//
// Note [Bounded index lock]
// A process stopped while it holds the index lock (SIGSTOP, a debugger, a
// cgroup freezer) holds it until it runs again: the kernel drops an OFD lock
// only when its file is closed. So no take of the index lock waits without
// a bound: lock() polls the lock (F_OFD_SETLK, a pause growing from 20 us to
// 2 ms) for at most ShareOptions::lock_wait_ms (1 s), and a take that runs
// out is counted (lock_timeouts) and changes nothing: acquire() returns no
// grant, so the cast is pinned privately (or served from its source);
// publish() and release() leave their update pending, made at the next take
// that succeeds; stats() reports the host's figures it saw last; detach()
// closes the index, so the kernel drops the slot's lock and the next process
// that looks reclaims the slot (an exit never waits longer than one bound).
// After a take ran out, every take tries once without waiting until one
// succeeds: a frozen peer costs this process one wait, not one per cast.
// Likewise for a peer frozen in a fill: once this process gave up waiting for
// one of its Writing entries (share_wait), it serves that writer's Writing
// entries from the source at once for another share_wait.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "csrc/base/clock.h"
#include "csrc/share/index_linux.h"
#include "csrc/share/share_testing.h"

namespace pins::share {
namespace {

std::atomic<void (*)()> g_on_locked{nullptr};

}  // namespace

void testing::set_on_locked(void (*hook)()) { g_on_locked.store(hook); }

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

bool held_by_other(int fd, off_t byte) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;  // cannot tell: assume alive (never drops a live lease)
  return fl.l_type != F_UNLCK;
}

bool HostShare::Impl::usable() const { return !detached && pid == getpid(); }

bool HostShare::Impl::lock() {
  const bool patient = !stuck.load(std::memory_order_relaxed);
  const auto wait = std::chrono::nanoseconds(patient ? lock_wait_ns : 0);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  // The thread lock's bound on the system clock: libstdc++ waits for a steady
  // one with pthread_mutex_clocklock, which ThreadSanitizer (GCC 12) does not
  // see, so it reports every unlock after it; pthread_mutex_timedlock it sees.
  // The file lock's bound, below, stays on the steady clock.
  if (!mu.try_lock_until(std::chrono::system_clock::now() + wait)) {
    lock_timeouts.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (fd < 0) return true;  // detached: nothing of the index is touched
  for (int64_t pause_us = 20;; pause_us = std::min<int64_t>(pause_us * 2, 2000)) {
    if (ofd_lock(fd, F_WRLCK, kIndexLockByte, /*wait=*/false)) break;
    // EAGAIN or EACCES: another description holds it. Anything else cannot
    // happen for one byte locked by one description; either way, again after a beat.
    if (std::chrono::steady_clock::now() >= deadline) {
      mu.unlock();
      lock_timeouts.fetch_add(1, std::memory_order_relaxed);
      stuck.store(true, std::memory_order_relaxed);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
  }
  stuck.store(false, std::memory_order_relaxed);
  if (void (*hook)() = g_on_locked.load()) hook();
  if (usable()) apply_pending();
  return true;
}

void HostShare::Impl::unlock() {
  if (fd >= 0) ofd_lock(fd, F_UNLCK, kIndexLockByte, false);
  mu.unlock();
}

void HostShare::Impl::defer(Pending p) {
  std::lock_guard<std::mutex> g(pending_mu);
  pending.push_back(p);
}

void HostShare::Impl::apply_pending() {
  std::vector<Pending> todo;
  {
    std::lock_guard<std::mutex> g(pending_mu);
    todo.swap(pending);
  }
  for (const Pending& p : todo) {
    if (p.publish) {
      if (publish(p.entry, p.generation)) published.fetch_add(1, std::memory_order_relaxed);
    } else {
      drop_lease(p.entry, p.generation);
    }
  }
}

}  // namespace pins::share
