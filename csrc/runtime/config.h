// Configuration of every pins component, parsed from one string with the syntax
// of PINS_CONF: `key:value,key:value`. The set of keys is closed; an unknown key
// or a bad value is a pins::ValueError that names it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/base/size.h"
#include "csrc/pool/options.h"

namespace pins {

enum class PolicyKind { Mru, Lru, Trace };

const char* to_string(PolicyKind k);

struct Config {
  // --- host pool (csrc/pool/) ---
  BackendKind backend = BackendKind::Auto;  // auto: cuda when a device is present
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
  std::string system_root = "/";       // where /proc and /sys are read (tests use fixtures)
};

// Parses `text` on top of `base`. Empty text returns `base`.
Config parse_config(std::string_view text, Config base = {});

// Parses the PINS_CONF environment variable (defaults when unset).
Config config_from_env();

// The host pool's part of `c` (its layout sizes and cap): the one place where
// PoolOptions are built from the configuration. The backend is make_backend(
// c.backend, c.mlock) (csrc/pool/backend.h).
PoolOptions pool_options(const Config& c);

// The closed set of keys, for error messages and documentation.
const std::vector<std::string>& config_keys();

}  // namespace pins
