// What wakes the pressure monitor's thread (Note [Pressure monitor wake-ups] in
// csrc/system/monitor.h): stop()'s wake-up, and the system's signal of memory
// pressure where it has one. One implementation per system:
// pressure_signal_linux.cpp (an eventfd and a PSI trigger) and
// pressure_signal_win.cpp (an event and a memory-resource notification).
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace pins {

class PressureSignal {
 public:
  // Closes this process's copies of what it waits on (in a fork child, Note
  // [Monitor across fork]: the parent's stay open).
  virtual ~PressureSignal() = default;

  // Whether the system's signal wakes wait(); it may stop doing so (on Linux,
  // a trigger whose cgroup went away). Only the waiting thread may ask, once
  // construction is over.
  virtual bool has_system_signal() const = 0;

  // Ends a wait() in progress, or the next one; any thread may call it.
  virtual void wake() = 0;

  enum class Woken {
    kTimeout,   // the timeout passed (or the wait was interrupted)
    kWake,      // wake() was called; consumed, so the next wait() waits again
    kPressure,  // the system signalled memory pressure
  };
  // Waits up to `timeout` (> 0) for either. One thread waits at a time.
  virtual Woken wait(std::chrono::milliseconds timeout) = 0;
};

// `root`: where Linux's PSI file is read (<root>/proc/pressure/memory); no
// meaning on Windows. Throws pins::ResourceError when the wake-up cannot be
// made; a system signal that cannot be had is only not used.
std::unique_ptr<PressureSignal> make_pressure_signal(const std::string& root);

}  // namespace pins
