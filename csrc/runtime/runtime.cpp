#include "csrc/runtime/runtime.h"

#include "csrc/runtime/default_pool.h"
#include "csrc/base/check.h"

namespace pins {

Runtime& Runtime::get() {
  static std::mutex mu;
  static Runtime* rt = nullptr;  // never destroyed: pins may be in use during static destruction
  std::lock_guard<std::mutex> g(mu);
  if (rt == nullptr) rt = new Runtime(config_from_env());
  return *rt;
}

Runtime::Runtime(const Config& c)
    : config_(c),
      pool_(default_pool()),
      probe_(std::make_unique<SystemMemoryProbe>(c.system_root)),
      balancer_(std::make_unique<Balancer>(c, pool_, *probe_)) {
  pool_.set_cap(c.cap);
  std::lock_guard<std::mutex> g(mu_);
  apply_monitor(c);
}

void Runtime::apply_monitor(const Config& c) {
  if (!c.monitor) {
    monitor_.reset();
    return;
  }
  monitor_ = std::make_unique<PressureMonitor>(
      *probe_, [this] { return balancer_->config().headroom; }, [this] { balancer_->relieve(); },
      std::chrono::milliseconds(c.monitor_interval_ms), c.system_root);
}

void Runtime::configure(std::string_view conf) {
  std::lock_guard<std::mutex> g(mu_);
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
  if (monitor_changed) apply_monitor(next);
}

Config Runtime::config() const {
  std::lock_guard<std::mutex> g(mu_);
  return config_;
}

bool Runtime::monitor_running() const {
  std::lock_guard<std::mutex> g(mu_);
  return monitor_ != nullptr;
}

}  // namespace pins
