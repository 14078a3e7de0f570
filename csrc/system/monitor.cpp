#include "csrc/system/monitor.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "csrc/base/check.h"

namespace pins {
namespace {

// See Note [Pressure monitor wake-ups]. Triggers are written with their NUL, as
// the kernel's PSI documentation does. Without CAP_SYS_RESOURCE the kernel
// (6.5+) takes only windows that are a multiple of 2 s, so the same 10% stall
// ratio over 2 s is the fallback.
constexpr char kPsiTrigger[] = "some 100000 1000000";
constexpr char kPsiTriggerUnprivileged[] = "some 200000 2000000";

// The monitor whose thread this is, so stop() can tell it is called from
// on_pressure() without reading thread_, which the constructor may still be
// assigning.
thread_local const PressureMonitor* t_monitor = nullptr;

// Note [Monitor across fork]: how many fork() children deep this process is,
// counted by a pthread_atfork child handler (async-signal-safe: one atomic add),
// registered before the first monitor is built.
std::atomic<uint64_t> g_fork_generation{0};

void count_fork_in_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

uint64_t fork_generation() {
  static const int registered = ::pthread_atfork(nullptr, nullptr, &count_fork_in_child);
  if (registered != 0) throw ResourceError(detail::cat("PressureMonitor: pthread_atfork failed: ", std::strerror(registered)));
  return g_fork_generation.load(std::memory_order_relaxed);
}

// A PSI trigger fd on `path`, or -1 when PSI cannot be used there: the file is
// missing, not writable, not on procfs (a test fixture, where a write would
// just succeed), or refuses both triggers (a kernel without PSI triggers).
int open_psi_trigger(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct statfs st;
  // A refused trigger leaves the file without one, so the second write may try.
  if (::fstatfs(fd, &st) != 0 || st.f_type != PROC_SUPER_MAGIC ||
      (::write(fd, kPsiTrigger, sizeof kPsiTrigger) < 0 &&
       ::write(fd, kPsiTriggerUnprivileged, sizeof kPsiTriggerUnprivileged) < 0)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

PressureMonitor::PressureMonitor(MemoryProbe& probe, std::function<uint64_t()> headroom,
                                 std::function<void()> on_pressure, std::chrono::milliseconds interval,
                                 std::string root)
    : probe_(probe),
      headroom_(std::move(headroom)),
      on_pressure_(std::move(on_pressure)),
      interval_(interval),
      pid_(::getpid()),
      fork_generation_(fork_generation()) {
  PINS_CHECK_VALUE(interval_.count() > 0, "PressureMonitor interval must be positive, got ", interval_.count(), " ms");
  PINS_CHECK_VALUE(headroom_ && on_pressure_, "PressureMonitor needs both a headroom and an on_pressure callable");
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw ResourceError(detail::cat("PressureMonitor: eventfd failed: ", std::strerror(errno)));
  psi_fd_ = open_psi_trigger((std::filesystem::path(root) / "proc/pressure/memory").string());
  uses_psi_.store(psi_fd_ >= 0);
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    ::close(wake_fd_);
    if (psi_fd_ >= 0) ::close(psi_fd_);
    throw ResourceError(detail::cat("PressureMonitor: cannot start its thread: ", e.what()));
  }
}

PressureMonitor::~PressureMonitor() {
  stop();
  ::close(wake_fd_);  // in a fork child, its own copy: the parent's stays open
  if (psi_fd_ >= 0) ::close(psi_fd_);
}

bool PressureMonitor::inherited() const {
  // The pid alone could be reused by a descendant; the generation alone would
  // miss a fork whose handlers did not run (a raw clone()).
  return g_fork_generation.load(std::memory_order_relaxed) != fork_generation_ || ::getpid() != pid_;
}

// Only the thread that called fork() exists in the child, so mu_ (which a
// parent thread may have held at the fork, and then stays held here forever)
// is not taken; abandoned_ makes a second call return.
void PressureMonitor::abandon_inherited() PINS_NO_THREAD_SAFETY_ANALYSIS {
  if (abandoned_.exchange(true)) return;
  // The thread is the parent's: neither join (it does not exist here) nor
  // destroy a joinable handle (std::terminate). Moving it out is plain memory.
  new std::thread(std::move(thread_));  // NOLINT: leaked on purpose
}

void PressureMonitor::stop() {
  stopping_.store(true);
  if (inherited()) {
    abandon_inherited();  // and no write to the eventfd the parent's thread polls
    return;
  }
  const uint64_t one = 1;
  // Cannot fail but for a counter overflow, and then the thread is awake anyway.
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  // From on_pressure(): the thread sees stopping_ when the callback returns. It
  // must not take mu_: a stop() on another thread may hold it, joining us.
  if (t_monitor == this) return;
  MutexLock lock(mu_);
  if (thread_.joinable()) thread_.join();
}

void PressureMonitor::check() {
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  try {
    const MemoryInfo m = probe_.read();
    if (m.available < headroom_()) {
      triggers_.fetch_add(1, std::memory_order_relaxed);
      on_pressure_();
    }
  } catch (...) {
    // A throw here would end the process (std::terminate on a thread); the
    // monitor is advisory, so it counts the failure and checks again later.
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
}

void PressureMonitor::run() {
  t_monitor = this;
  const int timeout = static_cast<int>(std::min<int64_t>(interval_.count(), INT_MAX));
  while (!stopping_.load()) {
    check();
    if (stopping_.load()) break;
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {psi_fd_, POLLPRI, 0}};
    const int rc = ::poll(fds, psi_fd_ >= 0 ? 2 : 1, timeout);
    if (rc < 0) continue;  // EINTR; poll on two fds has no other failure in practice
    if (fds[0].revents & POLLIN) {
      // stop() asked, or someone else wrote (a fork child built before Note
      // [Monitor across fork]): drain it, and go on unless stopping.
      uint64_t n = 0;
      [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &n, sizeof n);
      if (stopping_.load()) break;
      foreign_wakeups_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (psi_fd_ >= 0 && (fds[1].revents & (POLLERR | POLLHUP | POLLNVAL))) {
      // The trigger is gone (its cgroup was removed): go on polling.
      ::close(psi_fd_);
      psi_fd_ = -1;
      uses_psi_.store(false);
    }
  }
}

}  // namespace pins
