// The monitor's wake-ups on Windows: an event for stop(), and the system's
// low-memory notification in place of PSI (Note [Pressure monitor wake-ups]).
//
// Note [Windows pressure notification]
// CreateMemoryResourceNotification(LowMemoryResourceNotification) gives a
// handle that the system keeps signalled for as long as available memory is
// low (its own threshold, about 32 MiB per 4 GiB of RAM, up to 64 MiB), not an
// event that fires once: a thread that waited on it again at once would spin
// while memory stays low. So after it wakes the monitor the notification is
// disarmed: wait() waits on the stop() event alone, and at each timeout asks
// QueryMemoryResourceNotification whether memory is still low, arming it again
// once it is not. While memory stays low the monitor checks every interval, as
// it does anyway. The system's threshold is far below a usual headroom, so the
// notification mostly makes a sudden fall seen before the interval ends; the
// interval's checks against headroom() are what see memory run low first.
#include "csrc/system/pressure_signal.h"

#include <windows.h>

#include <algorithm>
#include <cstdint>

#include "csrc/base/check.h"
#include "csrc/base/win32.h"

namespace pins {
namespace {

class WindowsPressureSignal final : public PressureSignal {
 public:
  WindowsPressureSignal() {
    wake_ = CreateEventW(nullptr, /*bManualReset=*/FALSE, /*bInitialState=*/FALSE, nullptr);
    if (wake_ == nullptr)
      throw ResourceError(detail::cat("PressureMonitor: CreateEvent failed: ", win32::error_text(GetLastError())));
    low_memory_ = CreateMemoryResourceNotification(LowMemoryResourceNotification);  // nullptr: only polling
  }
  ~WindowsPressureSignal() override {
    CloseHandle(wake_);
    if (low_memory_ != nullptr) CloseHandle(low_memory_);
  }

  bool has_system_signal() const override { return low_memory_ != nullptr; }

  void wake() override { SetEvent(wake_); }  // an auto-reset event: one wait() consumes it

  Woken wait(std::chrono::milliseconds timeout) override {
    const HANDLE handles[2] = {wake_, low_memory_};
    const DWORD count = armed_ && low_memory_ != nullptr ? 2 : 1;
    const DWORD ms = static_cast<DWORD>(std::min<int64_t>(timeout.count(), INFINITE - 1));
    const DWORD rc = WaitForMultipleObjects(count, handles, FALSE, ms);
    if (rc == WAIT_OBJECT_0) return Woken::kWake;
    if (rc == WAIT_OBJECT_0 + 1) {
      armed_ = false;  // Note [Windows pressure notification]
      return Woken::kPressure;
    }
    if (!armed_ && !memory_low()) armed_ = true;
    return Woken::kTimeout;
  }

 private:
  bool memory_low() const {
    BOOL low = FALSE;
    return QueryMemoryResourceNotification(low_memory_, &low) && low;
  }

  HANDLE wake_ = nullptr;        // auto-reset event set by wake()
  HANDLE low_memory_ = nullptr;  // the notification; nullptr where the system refused one
  bool armed_ = true;            // only the waiting thread touches it
};

}  // namespace

// `root` names where Linux's PSI file is; Windows has none.
std::unique_ptr<PressureSignal> make_pressure_signal(const std::string&) {
  return std::make_unique<WindowsPressureSignal>();
}

}  // namespace pins
