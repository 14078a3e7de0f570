#include "csrc/system/monitor.h"

#include <algorithm>
#include <system_error>

#include "csrc/base/check.h"
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

bool PressureMonitor::check() {
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  try {
    const MemoryInfo m = probe_.read();
    if (m.available < headroom_()) {
      triggers_.fetch_add(1, std::memory_order_relaxed);
      on_pressure_();
      return true;
    }
  } catch (...) {
    // A throw here would end the process (std::terminate on a thread); the
    // monitor is advisory, so it counts the failure and checks again later.
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
  return false;
}

void PressureMonitor::run() {
  t_monitor = this;
  while (!stopping_.load()) {
    // Note [Pressure monitor wake-ups]: after a check that found pressure, the
    // next comes sooner.
    const std::chrono::milliseconds wait = check() ? std::min(interval_, kRecheck) : interval_;
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
