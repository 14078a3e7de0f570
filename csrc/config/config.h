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
#pragma once

#include <cstdint>
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
  uint64_t cap = 0;                    // hard cap on committed bytes; 0: the pin ceiling
  uint64_t retain_free = 64 * MiB;     // free committed bytes kept for reuse
  bool mlock = false;                  // cpu backend: mlock extents

  // --- balancer (csrc/), see DESIGN.md "Budget" ---
  PolicyKind policy = PolicyKind::Mru;
  bool fast_disk = false;              // no new pins in the -loaded subsets
  uint64_t headroom = 4 * GiB;         // available RAM the balancer keeps free
  uint64_t pin_reserve = 2 * GiB;      // floor of the per-pin headroom max(headroom/2, this)
  uint64_t pin_slack = 256 * MiB;      // extra freed when a pin needs room
  uint64_t relieve_slack = 512 * MiB;  // extra freed under RAM pressure
  double ceiling_min = 0.40;           // pin ceiling: max(min*R, min(max*R, R-reserve, R+swap-swap_reserve))
  double ceiling_max = 0.90;
  uint64_t ceiling_reserve = 4 * GiB;
  uint64_t ceiling_swap_reserve = 16 * GiB;
  uint64_t lock_hysteresis = 2 * GiB;  // page-lock drops go this far under the ceiling
  bool monitor = false;                // background thread that relieves RAM pressure
  uint64_t monitor_interval_ms = 200;  // poll period when PSI is unavailable
  bool prewarm = true;                 // Note [Prewarm] (csrc/balancer/prewarm.h): commit pool memory ahead of a prompt
  uint64_t memory_max_age_us = 5000;   // Note [Memory readings]: how long a reading of system memory stands
  std::string system_root = "/";       // where /proc and /sys are read (tests use fixtures); Linux only

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

// Parses the PINS_CONF environment variable (defaults when unset).
Config config_from_env();

// The host pool's part of `c` (its layout sizes and cap): the one place where
// PoolOptions are built from the configuration. The backend is make_backend(
// c.backend, c.mlock) (csrc/pool/backend.h).
PoolOptions pool_options(const Config& c);

// The closed set of keys, for error messages and documentation.
const std::vector<std::string>& config_keys();

}  // namespace pins
