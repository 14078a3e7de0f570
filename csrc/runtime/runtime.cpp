#include "csrc/runtime/runtime.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "csrc/base/check.h"

namespace pins {

Runtime& Runtime::get() {
  // Never destroyed (see runtime.h). The fast path is one atomic load: the
  // allocator's deleter comes here for every freed tensor.
  static std::atomic<Runtime*> instance{nullptr};
  if (Runtime* rt = instance.load(std::memory_order_acquire)) return *rt;
  static Mutex mu;  // serializes the first build only
  MutexLock g(mu);
  Runtime* rt = instance.load(std::memory_order_relaxed);
  if (rt == nullptr) {
    rt = new Runtime(config_from_env());  // a bad PINS_CONF throws: nothing stored, the next call tries again
    instance.store(rt, std::memory_order_release);
  }
  return *rt;
}

Runtime::Runtime(const Config& c)
    : config_(c),
      pool_(make_backend(c.backend, c.mlock), pool_options(c)),
      probe_(std::make_unique<SystemMemoryProbe>(c.system_root)),
      balancer_(std::make_unique<Balancer>(c, pool_, *probe_)),
      monitor_(c.monitor ? start_monitor(c.monitor_interval_ms, c.system_root) : nullptr) {}

// Members go in reverse order: the monitor is stopped (its thread joined, no
// lock held) before the balancer it calls is destroyed.
Runtime::~Runtime() = default;

std::unique_ptr<PressureMonitor> Runtime::start_monitor(uint64_t interval_ms, const std::string& root) {
  // The probe and the balancer outlive the monitor (see the member order).
  return std::make_unique<PressureMonitor>(
      *probe_, [this] { return balancer_->config().headroom; }, [this] { balancer_->relieve(); },
      std::chrono::milliseconds(interval_ms), root);
}

void Runtime::configure(std::string_view conf) {
  std::unique_ptr<PressureMonitor> old;  // destroyed (joined) after mu_ is released
  bool start = false;
  uint64_t interval_ms = 0;
  std::string root;
  uint64_t generation = 0;
  {
    MutexLock g(mu_);
    const Config next = parse_config(conf, config_);
    const auto fixed = [&](bool same, const char* key) {
      PINS_CHECK_VALUE(same, "configure: '", key,
                       "' is a setting of the host pool, which exists already; set it through PINS_CONF before "
                       "the first use of pins");
    };
    fixed(next.backend == config_.backend, "backend");
    fixed(next.segment_size == config_.segment_size, "segment_size");
    fixed(next.extent_min == config_.extent_min, "extent_min");
    fixed(next.alignment == config_.alignment, "alignment");
    fixed(next.retain_free == config_.retain_free, "retain_free");
    fixed(next.mlock == config_.mlock, "mlock");
    fixed(next.system_root == config_.system_root, "system_root");
    const bool monitor_changed =
        next.monitor != config_.monitor || next.monitor_interval_ms != config_.monitor_interval_ms;
    config_ = next;
    pool_.set_cap(next.cap);
    balancer_->configure(next);
    if (monitor_changed) {
      old = std::move(monitor_);
      generation = ++monitor_generation_;
      start = next.monitor;
      interval_ms = next.monitor_interval_ms;
      root = next.system_root;
    }
  }
  old.reset();  // joins the old monitor's thread, no lock held
  if (!start) return;
  std::unique_ptr<PressureMonitor> fresh = start_monitor(interval_ms, root);
  {
    MutexLock g(mu_);
    // A later configure() changed the monitor meanwhile: its setting wins, and
    // this one is dropped below, unlocked.
    if (generation == monitor_generation_) std::swap(monitor_, fresh);
  }
}

Config Runtime::config() const {
  MutexLock g(mu_);
  return config_;
}

bool Runtime::monitor_running() const {
  MutexLock g(mu_);
  return monitor_ != nullptr;
}

}  // namespace pins
