#include "csrc/system/monitor.h"

#include <algorithm>
#include <cmath>
#include <system_error>

#include "csrc/base/check.h"
#include "csrc/base/saturate.h"
#include "csrc/system/process.h"

namespace pins {
namespace {

// The monitor whose thread this is, so stop() can tell it is called from
// on_pressure() without reading thread_, which the constructor may still be
// assigning.
thread_local const PressureMonitor* t_monitor = nullptr;

}  // namespace

PressureMonitor::PressureMonitor(MemoryProbe& probe, std::function<uint64_t()> headroom,
                                 std::function<void()> on_pressure, std::chrono::milliseconds interval,
                                 std::string root)
    : probe_(probe),
      headroom_(std::move(headroom)),
      on_pressure_(std::move(on_pressure)),
      interval_(interval),
      pid_(process_id()),
      fork_generation_(fork_generation()) {
  PINS_CHECK_VALUE(interval_.count() > 0, "PressureMonitor interval must be positive, got ", interval_.count(), " ms");
  PINS_CHECK_VALUE(headroom_ && on_pressure_, "PressureMonitor needs both a headroom and an on_pressure callable");
  signal_ = make_pressure_signal(root);
  uses_psi_.store(signal_->has_system_signal());
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw ResourceError(detail::cat("PressureMonitor: cannot start its thread: ", e.what()));
  }
}

// signal_ closes this process's copies of what it waits on: in a fork child its
// own, the parent's stay open.
PressureMonitor::~PressureMonitor() { stop(); }

bool PressureMonitor::inherited() const {
  // The pid alone could be reused by a descendant; the generation alone would
  // miss a fork whose handlers did not run (a raw clone()).
  return fork_generation() != fork_generation_ || process_id() != pid_;
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
  signal_->wake();
  // From on_pressure(): the thread sees stopping_ when the callback returns. It
  // must not take mu_: a stop() on another thread may hold it, joining us.
  if (t_monitor == this) return;
  MutexLock lock(mu_);
  if (thread_.joinable()) thread_.join();
}

double pressure_fall_rate(double before, uint64_t fell, std::chrono::nanoseconds over,
                          std::chrono::milliseconds interval) {
  if (over.count() <= 0) return before;
  const double seconds = static_cast<double>(over.count()) / 1e9;
  const double now = static_cast<double>(fell) / seconds;
  const double halvings = seconds * 1e3 / static_cast<double>(interval.count());
  return std::max(now, before * std::exp2(-halvings));  // exp2 goes to 0 for a long time, never below
}

std::chrono::milliseconds pressure_check_wait(uint64_t available, uint64_t headroom, double fall_rate,
                                              std::chrono::milliseconds interval) {
  if (!(fall_rate > 0) || available < headroom) return interval;
  const double half_ms = static_cast<double>(available - headroom) / fall_rate * 1e3 / 2;
  const auto soonest = std::min(interval, kPressureRecheck);
  if (half_ms >= static_cast<double>(interval.count())) return interval;
  if (half_ms <= static_cast<double>(soonest.count())) return soonest;
  return std::chrono::milliseconds(static_cast<int64_t>(half_ms));
}

std::chrono::milliseconds PressureMonitor::check(std::optional<Reading>& last) {
  using Clock = std::chrono::steady_clock;
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  try {
    const Clock::time_point at = Clock::now();
    const MemoryInfo m = probe_.read();
    const uint64_t headroom = headroom_();
    const double fall_rate =
        last ? pressure_fall_rate(last->fall_rate, sub_sat(last->available, m.available), at - last->at, interval_)
             : 0;
    if (m.available < headroom) {
      triggers_.fetch_add(1, std::memory_order_relaxed);
      last.reset();  // a throw from on_pressure() leaves no reading behind
      on_pressure_();
      // Note [Pressure monitor wake-ups]: the next check measures the fall
      // from what the relief left, at the rate seen up to it.
      last = Reading{Clock::now(), probe_.read().available, fall_rate};
      return std::min(interval_, kPressureRecheck);
    }
    last = Reading{at, m.available, fall_rate};
    return pressure_check_wait(m.available, headroom, fall_rate, interval_);
  } catch (...) {
    // A throw here would end the process (std::terminate on a thread); the
    // monitor is advisory, so it counts the failure and checks again later.
    errors_.fetch_add(1, std::memory_order_relaxed);
    last.reset();
  }
  return interval_;
}

void PressureMonitor::run() {
  t_monitor = this;
  std::optional<Reading> last;
  while (!stopping_.load()) {
    // Note [Pressure monitor wake-ups]: sooner after pressure, or before a
    // fall reaches the headroom.
    const std::chrono::milliseconds wait = check(last);
    if (stopping_.load()) break;
    if (signal_->wait(wait) == PressureSignal::Woken::kWake) {
      // stop() asked, or someone else wrote (a fork child built before Note
      // [Monitor across fork]): go on unless stopping.
      if (stopping_.load()) break;
      foreign_wakeups_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // The trigger may be gone (its cgroup was removed): then the monitor polls.
    uses_psi_.store(signal_->has_system_signal());
  }
}

}  // namespace pins
