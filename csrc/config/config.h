// Configuration of every pins component, parsed from one string with the syntax
// of PINS_CONF: `key:value,key:value`. The set of keys is closed; an unknown key
// or a bad value is a pins::ValueError that names it.
//
// Note [Configuration bounds]
// Every value has bounds, checked by parse_config (docs/USAGE.md's Configuration
// table lists them); a value outside them is a pins::ValueError naming the key
// and the value. Byte amounts are at most kMaxConfigBytes (2^48, 256 TiB: the
// user address space of x86-64, and the largest block the pool hands out), so
// any sum of a few of them, and of a pin's size, stays far below 2^64 and the
// budget arithmetic (csrc/balancer/budget.h) never saturates on a setting.
// extent_min is at most kMaxExtentMin (64 MiB) and at most segment_size: an
// extent is committed for a pin of any size, outside the balancer's budget of
// that pin, so its size is bounded by what a small pin may cost.
//
// Note [Derived budget]
// headroom and pin_reserve scale with the machine unless PINS_CONF (or a
// configure()) sets them. From R, the RAM pins may use (MemTotal, or the
// cgroup's memory limit where lower: MemoryInfo::total, csrc/system/sysmem.h):
//   headroom    = min(clamp(R/16, 1 GiB, 4 GiB), R/4), rounded down to a MiB
//   pin_reserve = headroom / 2
// so a 16 GB machine keeps 1 GiB, 24 GiB keeps 1.5, 64 GB and more keep the
// former fixed 4 GiB, and a container limited to 2 GiB keeps 512 MiB rather
// than all of it. On the simulator's suite mru reads 6-11% fewer disk bytes at
// these than at a fixed 4 GiB (seeds 1-5, docs/SIMULATOR.md "The scenario
// suite"). The smaller slack for other processes' bursts is what the pressure
// monitor, on by default, is for: it frees pins once available RAM falls
// below the headroom, within a poll period (monitor_interval_ms) or at once
// on a PSI trigger, where without it only a node boundary would
// (docs/RELIABILITY.md "Memory pressure from another process"). Config's own
// defaults (4 GiB, 2 GiB) are what a configuration holds where no machine was
// read: Config{}, a runtime built from one (tests), a process whose meminfo
// cannot be read. pins-sim builds its balancer the same way from the trace's
// RAM: pin_reserve always, the headroom where the trace's machine sets none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/base/size.h"
#include "csrc/pool/options.h"

namespace pins {

enum class PolicyKind { Mru, Lru, Trace, Reuse };

const char* to_string(PolicyKind k);

struct Config {
  // --- host pool (csrc/pool/) ---
  BackendKind backend = BackendKind::Auto;  // auto: cuda, else hip, when a device is present
  uint64_t segment_size = 1 * GiB;     // address space reserved per segment
  uint64_t extent_min = 2 * MiB;       // smallest range committed and locked at once
  uint64_t alignment = 512;            // block alignment, a power of two <= 4 KiB
  uint64_t cap = 0;                    // hard cap on the pool's committed bytes; 0: none
  uint64_t retain_free = 64 * MiB;     // free committed bytes kept for reuse
  bool mlock = false;                  // cpu backend: mlock extents

  // --- balancer (csrc/), see DESIGN.md "Budget" ---
  PolicyKind policy = PolicyKind::Trace;
  bool fast_disk = false;              // no new pins in the -loaded subsets
  bool content_check = false;          // Note [Content check]: a hit compares a few windows of the source (cost: off)
  uint64_t headroom = 4 * GiB;         // available RAM the balancer keeps free; Note [Derived budget]
  uint64_t pin_reserve = 2 * GiB;      // floor of the per-pin headroom max(headroom/2, this); ditto
  uint64_t pin_slack = 256 * MiB;      // extra freed when a pin needs room
  uint64_t relieve_slack = 512 * MiB;  // extra freed under RAM pressure
  double ceiling_min = 0.40;           // pin ceiling: max(min*R, min(max*R, R-reserve, R+swap-swap_reserve))
  double ceiling_max = 0.90;
  uint64_t ceiling_reserve = 4 * GiB;
  uint64_t ceiling_swap_reserve = 16 * GiB;
  uint64_t lock_hysteresis = 2 * GiB;  // page-lock drops go this far under the ceiling
  bool monitor = true;                 // background thread that relieves RAM pressure
  uint64_t monitor_interval_ms = 200;  // poll period when PSI is unavailable
  bool prewarm = true;                 // Note [Prewarm] (csrc/balancer/prewarm.h): commit pool memory ahead of a prompt
  uint64_t memory_max_age_us = 5000;   // Note [Memory readings]: how long a reading of system memory stands
  std::string system_root = "/";       // where /proc and /sys are read (tests use fixtures); Linux only
  bool share = false;                  // Note [Shared pins] (csrc/share/host_share.h): file pins shared by the host
  std::string share_dir = "/dev/shm";  // where the shared pins' directory, pins-<uid>, is made

  friend bool operator==(const Config&, const Config&) = default;
};

// Note [Configuration bounds].
constexpr uint64_t kMaxConfigBytes = uint64_t{1} << 48;
constexpr uint64_t kMinSegmentSize = 64 * KiB;
constexpr uint64_t kMaxSegmentSize = 1 * TiB;
constexpr uint64_t kMinExtentMin = 4 * KiB;
constexpr uint64_t kMaxExtentMin = 64 * MiB;
constexpr uint64_t kMaxAlignment = 4096;
constexpr uint64_t kMaxMonitorIntervalMs = 60000;
constexpr uint64_t kMaxMemoryMaxAgeUs = 1000000;

// Parses `text` on top of `base`, then checks the whole result against Note
// [Configuration bounds] (so a bad `base` is refused too). Empty text returns
// `base` once it passes.
Config parse_config(std::string_view text, Config base = {});

// `c` in PINS_CONF syntax, every key in config_keys() order, sizes in bytes and
// fractions in the shortest text that reads back exactly:
// parse_config(format_config(c)) == c for every configuration parse_config
// returns.
std::string format_config(const Config& c);

// Parses the PINS_CONF environment variable over Config's own defaults
// (defaults when unset). The runtime derives headroom and pin_reserve from the
// machine on top (sourced_config; Runtime::get() in csrc/runtime/runtime.h).
Config config_from_env();

// The host pool's part of `c` (its layout sizes and cap): the one place where
// PoolOptions are built from the configuration. The backend is make_backend(
// c.backend, c.mlock) (csrc/pool/backend.h).
PoolOptions pool_options(const Config& c);

// The closed set of keys, for error messages and documentation.
const std::vector<std::string>& config_keys();

// The keys `text` sets (PINS_CONF syntax), each once, in the order of
// config_keys(); for a text parse_config accepted (it checks nothing: an entry
// that names no key is left out).
std::vector<std::string> keys_set_by(std::string_view text);

// Note [Derived budget]: what R was read from.
enum class BudgetBasis { Ram, CgroupLimit };

struct DerivedBudget {
  uint64_t headroom = 0;
  uint64_t pin_reserve = 0;
  BudgetBasis basis = BudgetBasis::Ram;
  uint64_t basis_bytes = 0;  // R

  friend bool operator==(const DerivedBudget&, const DerivedBudget&) = default;
};

// Note [Derived budget] for a machine of `ram` bytes (MemTotal) whose cgroup
// limits this process to `cgroup_limit` bytes (0: no limit); the lower of the
// two is R, and a limit not above `ram` is the basis (the runtime passes
// MemoryInfo::total for both where MemoryInfo::cgroup_limited). A pure
// function: no reading of the system.
DerivedBudget derive_budget(uint64_t ram, uint64_t cgroup_limit);

// Where a setting's value came from.
enum class ConfigSource {
  Default,    // Config's own default (csrc/config/config.h)
  Machine,    // derived from the machine, Note [Derived budget]
  Env,        // PINS_CONF
  Configure,  // a configure() call (pins::configure, pins.configure)
  Given,      // the Config a Runtime was built from (tests; the process's comes from PINS_CONF)
};

// "default", "derived from the machine: RAM 23.54 GiB" (or "cgroup limit ..."),
// "PINS_CONF", "configure()", "given". `derived` is what Machine sources come
// from; it is ignored for the others. No ',' in any of them.
std::string describe_source(ConfigSource s, const std::optional<DerivedBudget>& derived);

// The source of every key's value, in config_keys() order. (Bytes inside, not
// ConfigSource: a standard container instantiated on one of pins' enums is
// exported from libpins.so, which exports the public API only.)
class ConfigSources {
 public:
  explicit ConfigSources(ConfigSource all = ConfigSource::Default);
  // The source of `key`; std::out_of_range for a key config_keys() lacks.
  ConfigSource at(std::string_view key) const;
  ConfigSource operator[](std::string_view key) const { return at(key); }
  void set(std::string_view key, ConfigSource s);
  size_t size() const { return by_key_.size(); }

 private:
  size_t index(std::string_view key) const;
  std::vector<unsigned char> by_key_;
};

// A configuration and the source of each key's value.
struct SourcedConfig {
  Config config;
  ConfigSources sources;                 // every key of config_keys()
  std::optional<DerivedBudget> derived;  // the machine's figures, where read
};

// The process's configuration: `env_text` (PINS_CONF) over the defaults, with
// headroom and pin_reserve from `derived` where the text does not set them
// (Note [Derived budget]). Throws pins::ValueError for a bad text, as
// parse_config does.
SourcedConfig sourced_config(std::string_view env_text, const std::optional<DerivedBudget>& derived);

}  // namespace pins
