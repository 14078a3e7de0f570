// Lock annotations: Clang's thread-safety analysis (-Wthread-safety) checks
// them; every other compiler sees nothing.
//
// Note [Lock order]
// pins has three levels of locks, always taken in this order and never the
// reverse:
//   1. Runtime::mu_   (csrc/runtime/runtime.h)   the configuration and the monitor
//   2. Balancer::mu_  (csrc/balancer/balancer.h) the pin table and the configuration
//   3. HostPool::mu_  (csrc/pool/pool.h)         segments, extents and blocks
// A lower level may be taken while a higher one is held, for short
// non-blocking work only. No thread is joined, no driver call, fence query,
// allocation from the OS or /proc read is made while any of them is held
// (Runtime::configure moves a replaced monitor out and destroys it, joining its
// thread, after releasing Runtime::mu_; it builds the new one unlocked too).
// One leaf stands outside the levels: PressureMonitor::mu_
// (csrc/system/monitor.h) only serializes the join of the monitor's thread; it
// is never taken with one of the three held, nor one of them under it, and the
// monitor's thread (which takes levels 2 and 3 in Balancer::relieve) never
// takes it. Another leaf: BudgetGate::mu_ (csrc/balancer/budget_gate.h) guards
// the last memory reading and the reservations of pins being made (Note [Memory
// readings], Note [Budget reservation]); nothing else is taken while it is held
// (it may be taken under Balancer::mu_: the cast path and the fork handlers do).
// And the Prewarmer's two (Note [Prewarm] in csrc/balancer/prewarm.h): the lock
// its thread waits under, taken under Runtime::mu_ by Runtime::wake_prewarm and
// released by the thread before every step (which takes levels 2 and 3), and
// the one that serializes stop()'s join, which the thread never takes.
#pragma once

#include <mutex>

#if defined(__clang__)
#define PINS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PINS_THREAD_ANNOTATION(x)
#endif

// A type that is a lock.
#define PINS_CAPABILITY(name) PINS_THREAD_ANNOTATION(capability(name))
#define PINS_SCOPED_CAPABILITY PINS_THREAD_ANNOTATION(scoped_lockable)
// A field read or written only with `mu` held.
#define PINS_GUARDED_BY(mu) PINS_THREAD_ANNOTATION(guarded_by(mu))
// A pointer whose target is read or written only with `mu` held.
#define PINS_PT_GUARDED_BY(mu) PINS_THREAD_ANNOTATION(pt_guarded_by(mu))
// A function its caller calls with `mu` held.
#define PINS_REQUIRES(...) PINS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// A function its caller calls without `mu` held (it takes it).
#define PINS_EXCLUDES(...) PINS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define PINS_ACQUIRE(...) PINS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define PINS_RELEASE(...) PINS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define PINS_RETURN_CAPABILITY(x) PINS_THREAD_ANNOTATION(lock_returned(x))
#define PINS_NO_THREAD_SAFETY_ANALYSIS PINS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace pins {

// std::mutex with the annotations the analysis needs (libstdc++'s has none).
class PINS_CAPABILITY("mutex") Mutex {
 public:
  void lock() PINS_ACQUIRE() { mu_.lock(); }
  void unlock() PINS_RELEASE() { mu_.unlock(); }
  bool try_lock() PINS_THREAD_ANNOTATION(try_acquire_capability(true)) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// std::unique_lock for Mutex, seen by the analysis: held from construction to
// destruction, except between an unlock() and the next lock() (for blocking
// work in the middle of a critical section).
class PINS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) PINS_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() PINS_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() PINS_RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void lock() PINS_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

}  // namespace pins
