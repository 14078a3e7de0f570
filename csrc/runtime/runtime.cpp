#include "csrc/runtime/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/base/warn.h"
#include "csrc/system/process.h"

namespace pins {
namespace {

// Serializes Runtime::get()'s first build only. Constant-initialized, so a
// fork handler may take it whenever it runs.
Mutex g_build_mu;

// Every live Runtime, for the fork handlers (Note [Fork safety]). Never
// destroyed: a Runtime may outlive static destruction.
struct LiveRuntimes {
  Mutex mu;
  std::vector<Runtime*> list PINS_GUARDED_BY(mu);
};

LiveRuntimes& live_runtimes() {
  static LiveRuntimes* l = new LiveRuntimes;
  return *l;
}

}  // namespace

SourcedConfig process_config(const char* env_text) {
  const std::string_view text = env_text != nullptr ? std::string_view(env_text) : std::string_view();
  const Config c = parse_config(text);  // a bad text throws before anything is read
  std::optional<DerivedBudget> derived;
  try {
    const MemoryInfo m = SystemMemoryProbe(c.system_root).read();
    derived = derive_budget(m.total, m.cgroup_limited ? m.total : 0);
  } catch (const ResourceError&) {
    // No reading (a system root without meminfo): Config's fixed defaults stand,
    // and the balancer's own first reading will say what is wrong.
  }
  return sourced_config(text, derived);
}

Runtime& Runtime::get() {
  // Never destroyed (see runtime.h). The fast path is one atomic load: the
  // allocator's deleter comes here for every freed tensor.
  static std::atomic<Runtime*> instance{nullptr};
  if (Runtime* rt = instance.load(std::memory_order_acquire)) return *rt;
  MutexLock g(g_build_mu);
  Runtime* rt = instance.load(std::memory_order_relaxed);
  if (rt == nullptr) {
    // A bad PINS_CONF throws: nothing stored, the next call tries again.
    rt = new Runtime(process_config(std::getenv("PINS_CONF")));
    instance.store(rt, std::memory_order_release);
  }
  return *rt;
}

namespace {

// Note [Shared pins], "When sharing fails": sharing is an optimisation, so a
// process that cannot attach pins privately, says so once and in stats().
std::shared_ptr<share::HostShare> attach_share(const Config& c, Runtime::ShareState& state) {
  if (!c.share) return nullptr;
  share::ShareOptions o;
  o.root = c.share_dir;
  try {
    auto s = share::HostShare::attach(o);
    state.shared = true;
    return s;
  } catch (const share::AttachError& e) {
    state.reason = e.reason;
    state.message = e.what();
  }
  static std::atomic<bool> warned{false};
  warn_once(warned, state.message + "; this process pins privately (stats()['share_state'] is 0)");
  return nullptr;
}

SourcedConfig given(const Config& c) {
  SourcedConfig s;
  s.config = c;
  s.sources = ConfigSources(ConfigSource::Given);
  return s;
}

}  // namespace

Runtime::Runtime(const Config& c) : Runtime(given(c)) {}

Runtime::Runtime(const SourcedConfig& sc)
    : config_(sc.config),
      sources_(sc.sources),
      derived_(sc.derived),
      share_(attach_share(sc.config, share_state_)),
      pool_(make_backend(sc.config.backend, sc.config.mlock), pool_options(sc.config)),
      probe_(std::make_unique<SystemMemoryProbe>(sc.config.system_root,
                                                 static_cast<int64_t>(sc.config.memory_max_age_us) * 1000)),
      balancer_(std::make_unique<Balancer>(sc.config, pool_, *probe_)),
      monitor_(sc.config.monitor ? start_monitor(sc.config.monitor_interval_ms, sc.config.system_root) : nullptr),
      prewarmer_(sc.config.prewarm ? start_prewarmer() : nullptr) {
  // Note [Fork safety]: handlers registered once, before the first Runtime is
  // listed; they find every Runtime through the list.
  balancer_->set_share(share_);
  static const int registered = at_fork(&Runtime::prepare_fork, &Runtime::after_fork, &Runtime::after_fork);
  if (registered != 0) throw ResourceError(detail::cat("Runtime: pthread_atfork failed: ", std::strerror(registered)));
  LiveRuntimes& l = live_runtimes();
  MutexLock g(l.mu);
  l.list.push_back(this);
}

// Unlisted first, so no fork handler takes a lock of a Runtime being
// destroyed. Then the members go in reverse order: the monitor is stopped (its
// thread joined, no lock held) before the balancer it calls is destroyed.
Runtime::~Runtime() {
  LiveRuntimes& l = live_runtimes();
  MutexLock g(l.mu);
  l.list.erase(std::find(l.list.begin(), l.list.end(), this));
}

// The order of Note [Lock order], for each Runtime in turn: no other thread
// holds one Runtime's lock while waiting for another Runtime's, and nothing
// holding a pool's lock waits for any other lock.
void Runtime::prepare_fork() PINS_NO_THREAD_SAFETY_ANALYSIS {
  g_build_mu.lock();
  LiveRuntimes& l = live_runtimes();
  l.mu.lock();
  for (Runtime* rt : l.list) {
    rt->mu_.lock();
    rt->balancer_->lock_for_fork();
    rt->pool_.lock_for_fork();
  }
}

void Runtime::after_fork() PINS_NO_THREAD_SAFETY_ANALYSIS {
  LiveRuntimes& l = live_runtimes();
  for (auto it = l.list.rbegin(); it != l.list.rend(); ++it) {
    (*it)->pool_.unlock_after_fork();
    (*it)->balancer_->unlock_after_fork();
    (*it)->mu_.unlock();
  }
  l.mu.unlock();
  g_build_mu.unlock();
}

std::unique_ptr<PressureMonitor> Runtime::start_monitor(uint64_t interval_ms, const std::string& root) {
  // The probe and the balancer outlive the monitor (see the member order);
  // Its line is read without the balancer's lock (Note [Fork safety]); pins'
  // own growth inside a node is not pressure (Note [Pressure from others]).
  return std::make_unique<PressureMonitor>(
      *probe_, [this] { return balancer_->pressure_line(); }, [this] { balancer_->relieve(); },
      std::chrono::milliseconds(interval_ms), root);
}

std::unique_ptr<Prewarmer> Runtime::start_prewarmer() { return std::make_unique<Prewarmer>(*balancer_); }

void Runtime::configure(std::string_view conf) {
  std::unique_ptr<PressureMonitor> old;  // destroyed (joined) after mu_ is released
  std::unique_ptr<Prewarmer> old_prewarmer;  // likewise
  bool start = false;
  uint64_t interval_ms = 0;
  std::string root;
  uint64_t generation = 0;
  bool start_prewarm = false;
  uint64_t prewarm_generation = 0;
  {
    MutexLock g(mu_);
    const Config next = parse_config(conf, config_);
    const std::vector<std::string> set = keys_set_by(conf);
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
    fixed(next.share == config_.share, "share");
    fixed(next.share_dir == config_.share_dir, "share_dir");
    // A monitor inherited through fork() is replaced whatever the text says
    // (Note [Fork safety]): the child starts its own when next.monitor asks.
    const bool inherited = monitor_ != nullptr && monitor_->inherited();
    const bool monitor_changed =
        inherited || next.monitor != config_.monitor || next.monitor_interval_ms != config_.monitor_interval_ms;
    // Note [Prewarm]: the same for the prewarm's thread. The test is against
    // the configuration, not against prewarmer_: while an earlier configure()
    // starts a Prewarmer with no lock held, prewarmer_ is null, and a
    // "prewarm:false" that saw only that would leave the generation alone and
    // let the earlier one install a thread the configuration says is off.
    const bool prewarm_changed =
        (prewarmer_ != nullptr && prewarmer_->inherited()) || next.prewarm != config_.prewarm;
    config_ = next;
    for (const std::string& k : set) sources_.set(k, ConfigSource::Configure);
    pool_.set_cap(next.cap);
    probe_->set_max_age_ns(static_cast<int64_t>(next.memory_max_age_us) * 1000);
    balancer_->configure(next);
    if (monitor_changed) {
      old = std::move(monitor_);
      generation = ++monitor_generation_;
      start = next.monitor;
      interval_ms = next.monitor_interval_ms;
      root = next.system_root;
    }
    if (prewarm_changed) {
      old_prewarmer = std::move(prewarmer_);
      prewarm_generation = ++prewarm_generation_;
      start_prewarm = next.prewarm;
    }
  }
  old_prewarmer.reset();  // joins the old thread, no lock held
  if (start_prewarm) {
    std::unique_ptr<Prewarmer> fresh = start_prewarmer();
    {
      MutexLock g(mu_);
      if (prewarm_generation == prewarm_generation_) std::swap(prewarmer_, fresh);
    }
    // One a later configure() replaced meanwhile is joined here, unlocked.
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

void Runtime::wake_prewarm() {
  MutexLock g(mu_);
  if (prewarmer_ != nullptr && !prewarmer_->inherited()) prewarmer_->wake();
}

Runtime::PrewarmStatus Runtime::prewarm_status() const {
  MutexLock g(mu_);
  PrewarmStatus s;
  if (prewarmer_ == nullptr || prewarmer_->inherited()) return s;
  s.running = true;
  s.busy = prewarmer_->busy();
  s.rounds = prewarmer_->rounds();
  s.committed = prewarmer_->committed();
  s.errors = prewarmer_->errors();
  return s;
}

Config Runtime::config() const {
  MutexLock g(mu_);
  return config_;
}

std::vector<std::pair<std::string, std::string>> Runtime::config_sources() const {
  MutexLock g(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& k : config_keys()) out.emplace_back(k, describe_source(sources_.at(k), derived_));
  return out;
}

bool Runtime::monitor_running() const {
  MutexLock g(mu_);
  return monitor_ != nullptr && !monitor_->inherited();
}

Runtime::MonitorStatus Runtime::monitor_status() const {
  MutexLock g(mu_);
  MonitorStatus s;
  if (monitor_ == nullptr || monitor_->inherited()) return s;
  s.running = true;
  s.uses_psi = monitor_->uses_psi();
  s.wakeups = monitor_->wakeups();
  s.triggers = monitor_->triggers();
  s.errors = monitor_->errors();
  s.foreign_wakeups = monitor_->foreign_wakeups();
  return s;
}

}  // namespace pins
