// A background thread that reports RAM pressure: available RAM below the
// balancer's headroom. See DESIGN.md "Budget" (RAM pressure check).
//
// Note [Pressure monitor wake-ups]
// The thread checks probe.read().available against headroom() and calls
// on_pressure() when it is below. The runtime's headroom() is the balancer's
// pressure line: the headroom less pins' own growth into their slack since the
// last relief (Note [Pressure from others] in csrc/balancer/budget.h), so what
// it sees is other processes' pressure. It checks at start, then whenever it wakes:
//  - on a Linux PSI trigger on <root>/proc/pressure/memory ("some 100000
//    1000000": 100 ms of memory stall within 1 s, POLLPRI; "some 200000
//    2000000" where the kernel refuses 1 s windows to a process without
//    CAP_SYS_RESOURCE), when that file is a procfs file that accepts a trigger;
//    otherwise PSI is not used;
//  - on Windows, when the system's low-memory notification is signalled
//    (Note [Windows pressure notification]); uses_psi() then says that this
//    signal, Windows' stand-in for PSI, is in use;
//  - every `interval` in either mode, because RAM can run out slowly without
//    any stall, which PSI alone would miss;
//  - kPressureRecheck (20 ms) after a check that found pressure, when that is
//    sooner: a process that allocates faster than on_pressure() frees (the
//    balancer's relief gives back relieve_slack past the headroom) keeps
//    available RAM below the headroom past one relief, and would otherwise keep
//    it there a whole interval more (the hog check, docs/RELIABILITY.md "Memory
//    pressure from another process"). Under pressure that nothing relieves,
//    that is 50 checks a second, each a read of the probe and an on_pressure();
//  - before available RAM, falling, reaches the headroom: a check that found
//    no pressure waits half the time the fall would take to reach it, at least
//    kPressureRecheck and at most `interval` (pressure_check_wait). The rate of
//    the fall is the one since the reading before, or, when larger, the rate
//    measured then halved for each interval since (pressure_fall_rate): an
//    allocator descheduled on a loaded machine falls silent between two checks
//    and then goes on at its old rate. The reading before is the last check's,
//    or the one taken right after an on_pressure(), so the check after a relief
//    measures the fall from what the relief left. With the interval alone, an
//    episode that began just after a check lasted the whole interval and the
//    relief after it: in the hog check, 2 of 31 episodes past the 200 ms
//    period (up to 254 ms); with the fall measured, every episode ended within
//    about 25 ms. Only the waits change: nothing is freed before available RAM
//    is below the headroom, and RAM that stands, rises or falls far from the
//    headroom keeps the interval.
// stop() wakes the thread through an eventfd (an event on Windows), so it
// returns as soon as a check in progress (and its on_pressure()) finishes,
// whatever the interval. A wake-up on the eventfd that stop() did not ask for
// is drained and ignored. The system's side of it all is a PressureSignal
// (csrc/system/pressure_signal.h).
//
// Note [Monitor across fork]
// A child of fork() gets a copy of the monitor object but not its thread, and
// shares the eventfd and the PSI trigger (same open files) with the parent. In
// the child the monitor is *inherited*: stop() and the destructor neither write
// to the shared eventfd (that would wake the parent's thread) nor join the
// thread (it does not exist here; joining it aborted). They close the child's
// own copies of the descriptors (the parent's stay open, and its PSI trigger
// with them) and abandon the thread handle (a few bytes leaked per inherited
// monitor). An inherited monitor never checks anything: whoever owns it builds
// a new one in the child if it wants one (Runtime::configure does). Windows
// has no fork(): there a monitor is never inherited (csrc/system/process.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "csrc/base/thread_safety.h"
#include "csrc/system/pressure_signal.h"
#include "csrc/system/sysmem.h"

namespace pins {

// Note [Pressure monitor wake-ups]: the soonest check after one that found
// pressure, or before a fall reaches the headroom.
inline constexpr std::chrono::milliseconds kPressureRecheck{20};

// Note [Pressure monitor wake-ups]: the rate in bytes a second at which
// available RAM falls, after a reading `fell` bytes below the one `over` before
// it, where the rate measured then was `before`: the larger of this fall's rate
// and `before` halved for each `interval` since.
double pressure_fall_rate(double before, uint64_t fell, std::chrono::nanoseconds over,
                          std::chrono::milliseconds interval);
// Note [Pressure monitor wake-ups]: how long to wait after a check that found
// `available` >= `headroom`, with available RAM falling at `fall_rate` bytes a
// second: half the time it takes to reach the headroom at that rate, within
// [min(interval, kPressureRecheck), interval]; `interval` when it does not fall.
std::chrono::milliseconds pressure_check_wait(uint64_t available, uint64_t headroom, double fall_rate,
                                              std::chrono::milliseconds interval);

class PressureMonitor {
 public:
  // `probe`, and whatever `headroom` and `on_pressure` reach, must outlive the
  // monitor. They run on the monitor's thread (never under a lock of the
  // monitor); headroom is a callable so configuration changes apply to the next
  // check. `interval` must be > 0.
  // Throws pins::ValueError for a bad interval, pins::ResourceError when the
  // thread or its wake-up descriptor cannot be created.
  PressureMonitor(MemoryProbe& probe, std::function<uint64_t()> headroom, std::function<void()> on_pressure,
                  std::chrono::milliseconds interval, std::string root = "/");
  // Stops and joins. Must not run on the monitor's thread (from on_pressure),
  // nor with a lock held that on_pressure or headroom may take (Note [Lock order]).
  ~PressureMonitor();
  PressureMonitor(const PressureMonitor&) = delete;
  PressureMonitor& operator=(const PressureMonitor&) = delete;

  // Stops the thread and joins it; idempotent and callable from any thread
  // (with no lock held that the callables may take). Called from on_pressure()
  // it only asks the thread to stop (no self-join).
  void stop() PINS_EXCLUDES(mu_);

  // Note [Monitor across fork]: this object was built in another process, of
  // which this one is a fork() child; its thread does not run here.
  bool inherited() const;

  bool uses_psi() const { return uses_psi_.load(std::memory_order_relaxed); }
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }    // COUNT of checks made
  uint64_t triggers() const { return triggers_.load(std::memory_order_relaxed); }  // COUNT of on_pressure() calls
  // COUNT of checks in which the probe, headroom() or on_pressure() threw; the
  // exception is dropped and the monitor goes on.
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }
  // COUNT of eventfd wake-ups that stop() did not ask for (drained, ignored).
  uint64_t foreign_wakeups() const { return foreign_wakeups_.load(std::memory_order_relaxed); }

 private:
  // A reading of available RAM and when it was taken: what a check measures
  // the fall from (Note [Pressure monitor wake-ups]).
  struct Reading {
    std::chrono::steady_clock::time_point at;
    uint64_t available = 0;
    double fall_rate = 0;  // bytes a second (pressure_fall_rate), up to this reading
  };

  void run();
  // One check; returns how long to wait for the next. `last` is the reading the
  // fall is measured from (none at first and after a failed check); the check
  // replaces it.
  std::chrono::milliseconds check(std::optional<Reading>& last);
  void abandon_inherited();  // Note [Monitor across fork]

  MemoryProbe& probe_;
  const std::function<uint64_t()> headroom_;
  const std::function<void()> on_pressure_;
  const std::chrono::milliseconds interval_;
  // Where the monitor was built: the process and the count of fork() children
  // this process descends from (Note [Monitor across fork]).
  const int pid_;
  const uint64_t fork_generation_;
  std::atomic<bool> abandoned_{false};  // an inherited monitor's stop() ran
  // stop()'s wake-up and the system's signal; after construction only the
  // thread waits on it.
  std::unique_ptr<PressureSignal> signal_;
  std::atomic<bool> uses_psi_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> wakeups_{0};
  std::atomic<uint64_t> triggers_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> foreign_wakeups_{0};
  // Serializes stop()'s join, so a second stop() returns only once the thread
  // is gone. A leaf outside the three levels of Note [Lock order]: the thread
  // never takes it (stop() from on_pressure() returns before it), and no other
  // lock is taken while it is held.
  Mutex mu_;
  // Declared last: started once all else is set (the constructor assigns it
  // before any stop() can run).
  std::thread thread_ PINS_GUARDED_BY(mu_);
};

}  // namespace pins
