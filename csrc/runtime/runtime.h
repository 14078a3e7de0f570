// The process-wide pins state, and its one composition root: the configuration
// (PINS_CONF, parsed once, over a budget derived from the machine), the host
// pool, the system memory probe, the balancer and, unless configured off, the
// RAM-pressure monitor. The torch ops and the c10 allocator adapter (ops/)
// reach all of them through Runtime::get().
//
// Note [Fork safety]
// Applications fork (DataLoader workers, multiprocessing). A fork() child has
// one thread, the one that forked, and a copy of everything else:
//  - Locks. pthread_atfork handlers, registered with the first Runtime, hold
//    across fork() the lock of Runtime::get()'s first build and, for every
//    live Runtime in Note [Lock order], its mu_, its balancer's mu_
//    (Balancer::lock_for_fork) and its pool's mu_; both processes release
//    them after, in reverse. So no lock of these is copied held by a thread
//    that does not exist in the child, and the bookkeeping they guard is
//    copied between two critical sections. Work that runs between two lock
//    holds (a backend call, a fence query, a pin being filled) is not waited
//    for: in the child, the bytes a commit or a reap held in between stay out
//    of use (leaked address space, never a broken invariant), and a pin
//    another thread was filling or leasing stays in use (never served, never
//    freed).
//  - The monitor (Note [Monitor across fork], csrc/system/monitor.h). The
//    child's copy has no thread: monitor_running() says false, and the next
//    configure() in the child replaces it, starting the child's own monitor
//    when the configuration asks for one; the parent's monitor is untouched.
//    Its line is read from atomics of the balancer (Balancer::pressure_line,
//    Note [Pressure from others]), not under the balancer's lock, so the
//    monitor thread never holds that lock but to relieve pressure.
//  - The prewarm's thread (Note [Prewarm] in csrc/balancer/prewarm.h) is
//    handled as the monitor's: the child's Prewarmer has none and never
//    touches what the parent's thread waits on; wake_prewarm() does nothing
//    there until the child's next configure() starts its own.
//  - The pool's memory is copied on write; its page-locks are the parent's
//    (mlock is not inherited; a CUDA registration belongs to the parent's CUDA
//    context, which a child must not use, as CUDA itself requires). Adopted
//    blocks (Note [Adopted blocks] in csrc/pool/pool.h) are shared mappings,
//    not copies: a free of one in the child runs its owner's release there.
// Windows has no fork(): there nothing is registered and none of this arises
// (csrc/system/process.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "csrc/balancer/balancer.h"
#include "csrc/balancer/prewarm.h"
#include "csrc/share/host_share.h"
#include "csrc/base/thread_safety.h"
#include "csrc/pool/pool.h"
#include "csrc/config/config.h"
#include "csrc/system/monitor.h"
#include "csrc/system/sysmem.h"

namespace pins {

// The process's configuration from the text of PINS_CONF (`env_text`, null when
// unset): headroom and pin_reserve derived from this machine's memory (RAM, or
// the cgroup limit where lower) where the text does not set them (Note [Derived
// budget] in csrc/config/config.h). Reads <system_root>/proc/meminfo and the
// cgroup files once (SystemMemoryProbe); where that fails, Config's fixed
// defaults stand. Throws pins::ValueError for a bad text.
SourcedConfig process_config(const char* env_text);

class Runtime {
 public:
  // The process-wide instance, built on first use from PINS_CONF
  // (process_config). A bad PINS_CONF throws pins::ValueError (and the next
  // call tries again). It is never destroyed: tensors whose storage is a pool
  // block may outlive static destruction.
  static Runtime& get();

  // A runtime of its own, from `c` (tests; the process uses get()). Builds the
  // pool (make_backend(c.backend, c.mlock), pool_options(c)), the probe of
  // c.system_root, the balancer over both, when c.monitor the monitor and when
  // c.prewarm the Prewarmer (Note [Prewarm]). Throws pins::ValueError when the
  // backend cannot be built, pins::ResourceError when a thread cannot start.
  explicit Runtime(const Config& c);
  // The same from a configuration and its sources (what config_sources() says;
  // Runtime(const Config&) says "given" for every key).
  explicit Runtime(const SourcedConfig& sc);
  // Stops the Prewarmer and the monitor (joins their threads), then destroys the
  // balancer (its pins go back to the pool), the probe and the pool: no other
  // block of the pool may be live by then, and no other thread may be using
  // the runtime.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The parts live as long as the Runtime (for get(): the whole process).
  Balancer& balancer() { return *balancer_; }
  HostPool& pool() { return pool_; }
  // Note [Shared pins]: the host index this process shares through; null with
  // share:false, and when attaching failed (share_state() says why).
  share::HostShare* share() const { return share_.get(); }
  // Note [Shared pins], "When sharing fails": with share:true, whether this
  // process shares; when not, why (AttachError's reason word and its message).
  struct ShareState {
    bool shared = false;
    std::string reason;
    std::string message;
  };
  const ShareState& share_state() const { return share_state_; }
  MemoryProbe& probe() { return *probe_; }

  // Applies `conf` (PINS_CONF syntax) on top of the current configuration. The
  // pool's own keys (backend, segment_size, extent_min, alignment, retain_free,
  // mlock) and system_root are fixed once the pool exists: changing one is a
  // pins::ValueError naming it; `cap` applies at once. Nothing changes when the
  // text is invalid. A monitor that cannot start throws pins::ResourceError
  // after the rest was applied (monitor_running() is false then). Concurrent
  // calls apply in some order, and the monitor ends as the last one set it.
  void configure(std::string_view conf) PINS_EXCLUDES(mu_);
  Config config() const PINS_EXCLUDES(mu_);
  // Where each setting in force came from, every key in config_keys() order:
  // (key, describe_source()), e.g. ("headroom", "derived from the machine: RAM
  // 23.54 GiB"). A key a configure() text named says "configure()".
  std::vector<std::pair<std::string, std::string>> config_sources() const PINS_EXCLUDES(mu_);
  // A monitor whose thread runs in this process (false in a fork child until
  // configure() starts the child's own, Note [Fork safety]).
  bool monitor_running() const PINS_EXCLUDES(mu_);

  // Note [Prewarm]: a round of the prewarm, when one runs here (`prewarm` on,
  // not a fork child's copy). The ops call it after mark_prompt with models
  // and set_active(model, true). Returns at once.
  void wake_prewarm() PINS_EXCLUDES(mu_);
  struct PrewarmStatus {
    bool running = false;    // a Prewarmer whose thread runs in this process
    bool busy = false;       // a round asked for or running
    uint64_t rounds = 0;     // COUNT rounds run
    uint64_t committed = 0;  // SUM bytes committed ahead of need
    uint64_t errors = 0;     // COUNT steps that threw
  };
  PrewarmStatus prewarm_status() const PINS_EXCLUDES(mu_);

  // The monitor's counters (PressureMonitor), zero when none runs here.
  struct MonitorStatus {
    bool running = false;      // monitor_running()
    bool uses_psi = false;
    uint64_t wakeups = 0;      // COUNT checks made
    uint64_t triggers = 0;     // COUNT on_pressure() calls
    uint64_t errors = 0;       // COUNT checks that threw
    uint64_t foreign_wakeups = 0;  // COUNT eventfd wake-ups that stop() did not ask for
  };
  MonitorStatus monitor_status() const PINS_EXCLUDES(mu_);

 private:
  // A monitor of the balancer's headroom, polling every `interval_ms`, with PSI
  // read under `root`. Called without mu_ held: it starts a thread and opens
  // /proc files.
  std::unique_ptr<PressureMonitor> start_monitor(uint64_t interval_ms, const std::string& root) PINS_EXCLUDES(mu_);
  // Starts a Prewarmer's thread: called without mu_ held, as start_monitor.
  std::unique_ptr<Prewarmer> start_prewarmer() PINS_EXCLUDES(mu_);

  // Note [Fork safety]: the pthread_atfork handlers (after_fork serves both
  // the parent and the child).
  static void prepare_fork();
  static void after_fork();

  // Level 1 of Note [Lock order] (csrc/base/thread_safety.h): held while the
  // balancer's and the pool's locks are taken (configure), never while a
  // monitor is built or destroyed (that starts or joins its thread).
  mutable Mutex mu_;
  Config config_ PINS_GUARDED_BY(mu_);
  // Every key's source, as config_sources() says it, and what "derived from
  // the machine" was derived from.
  ConfigSources sources_ PINS_GUARDED_BY(mu_);
  const std::optional<DerivedBudget> derived_;
  // Declared in build order; destroyed in reverse: the balancer frees into the
  // pool and reads the probe, so both outlive it; the monitor calls the
  // balancer and reads the probe, so it goes first.
  // Note [Shared pins]: attached when config_.share; before the pool, whose
  // adopted blocks release into it (they hold it too). share_state_ first:
  // the attach writes it.
  ShareState share_state_;
  const std::shared_ptr<share::HostShare> share_;
  HostPool pool_;
  const std::unique_ptr<SystemMemoryProbe> probe_;
  const std::unique_ptr<Balancer> balancer_;
  std::unique_ptr<PressureMonitor> monitor_ PINS_GUARDED_BY(mu_);
  // Bumped by every configure() that changes the monitor's settings; a monitor
  // built outside mu_ is installed only if no later change came first.
  uint64_t monitor_generation_ PINS_GUARDED_BY(mu_) = 0;
  // Note [Prewarm]; declared last, so destroyed (joined) first: its thread
  // calls the balancer. Replaced by configure() as the monitor is.
  std::unique_ptr<Prewarmer> prewarmer_ PINS_GUARDED_BY(mu_);
  uint64_t prewarm_generation_ PINS_GUARDED_BY(mu_) = 0;
};

}  // namespace pins
