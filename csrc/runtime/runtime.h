// The process-wide pins state behind the torch ops: the configuration, the host
// pool, the system memory probe, the balancer and, when configured, the
// RAM-pressure monitor. Built on first use from PINS_CONF.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "csrc/balancer/balancer.h"
#include "csrc/system/monitor.h"
#include "csrc/system/sysmem.h"

namespace pins {

class Runtime {
 public:
  // The instance; a bad PINS_CONF throws pins::ValueError (and the next call
  // tries again).
  static Runtime& get();

  Balancer& balancer() { return *balancer_; }
  HostPool& pool() { return pool_; }
  MemoryProbe& probe() { return *probe_; }

  // Applies `conf` (PINS_CONF syntax) on top of the current configuration. The
  // pool's own keys (backend, segment_size, extent_min, alignment, retain_free,
  // mlock) are fixed once the pool exists: changing one is a pins::ValueError
  // naming it; `cap` applies at once. Nothing changes when the text is invalid.
  void configure(std::string_view conf);
  Config config() const;
  bool monitor_running() const;

 private:
  explicit Runtime(const Config& c);
  void apply_monitor(const Config& c);  // LOCK: mu_

  mutable std::mutex mu_;
  Config config_;  // LOCK: mu_
  HostPool& pool_;
  std::unique_ptr<SystemMemoryProbe> probe_;
  std::unique_ptr<Balancer> balancer_;
  std::unique_ptr<PressureMonitor> monitor_;  // LOCK: mu_
};

}  // namespace pins
