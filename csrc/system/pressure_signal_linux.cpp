// The monitor's wake-ups on Linux: an eventfd, and a PSI trigger where the
// system grants one (Note [Pressure monitor wake-ups]).
#include "csrc/system/pressure_signal.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "csrc/base/check.h"

namespace pins {
namespace {

// See Note [Pressure monitor wake-ups]. Triggers are written with their NUL, as
// the kernel's PSI documentation does. Without CAP_SYS_RESOURCE the kernel
// (6.5+) takes only windows that are a multiple of 2 s, so the same 10% stall
// ratio over 2 s is the fallback.
constexpr char kPsiTrigger[] = "some 100000 1000000";
constexpr char kPsiTriggerUnprivileged[] = "some 200000 2000000";

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

class LinuxPressureSignal final : public PressureSignal {
 public:
  explicit LinuxPressureSignal(const std::string& root) {
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw ResourceError(detail::cat("PressureMonitor: eventfd failed: ", std::strerror(errno)));
    psi_fd_ = open_psi_trigger((std::filesystem::path(root) / "proc/pressure/memory").string());
  }
  ~LinuxPressureSignal() override {
    ::close(wake_fd_);
    if (psi_fd_ >= 0) ::close(psi_fd_);
  }

  bool has_system_signal() const override { return psi_fd_ >= 0; }

  void wake() override {
    const uint64_t one = 1;
    // Cannot fail but for a counter overflow, and then the thread is awake anyway.
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  Woken wait(std::chrono::milliseconds timeout) override {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {psi_fd_, POLLPRI, 0}};
    const int rc = ::poll(fds, psi_fd_ >= 0 ? 2 : 1, static_cast<int>(std::min<int64_t>(timeout.count(), INT_MAX)));
    if (rc < 0) return Woken::kTimeout;  // EINTR; poll on two fds has no other failure in practice
    if (fds[0].revents & POLLIN) {
      // Drained, so the next wait waits.
      uint64_t n = 0;
      [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &n, sizeof n);
      return Woken::kWake;
    }
    if (psi_fd_ >= 0 && (fds[1].revents & (POLLERR | POLLHUP | POLLNVAL))) {
      // The trigger is gone (its cgroup was removed): go on polling.
      ::close(psi_fd_);
      psi_fd_ = -1;
    }
    return rc == 0 ? Woken::kTimeout : Woken::kPressure;
  }

 private:
  int wake_fd_ = -1;  // eventfd written by wake()
  int psi_fd_ = -1;   // PSI trigger, -1 when polling; after construction only the waiting thread touches it
};

}  // namespace

std::unique_ptr<PressureSignal> make_pressure_signal(const std::string& root) {
  return std::make_unique<LinuxPressureSignal>(root);
}

}  // namespace pins
