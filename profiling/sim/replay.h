// Replays an expansion through a pin policy over the modelled machine: the real
// Balancer (mru, lru, trace) over a HostPool with the null backend, or the
// Belady oracle. No real allocation happens; bytes are counted exactly.
//
// Note [Simulator memory model]
// Host RAM holds other_ram (the OS, the desktop, the application; fixed), the
// LoRA files the current prompt uses, the pool's committed bytes (pins), and the
// OS page cache in whatever is left. The balancer sees available RAM = ram -
// other_ram - LoRA bytes - committed: the page cache is reclaimable, so it
// never counts as used. A weight's source is its file, mmap-ed: a read that no
// pin serves goes through the page cache (LRU over the RAM the pins leave free;
// a miss reads the disk and inserts the weight), as it does under every policy.
// A LoRA's factors live in process RAM: no disk read, ever.
//
// Note [Simulator time model]
// Modelled time is transfer time only, each transfer serial, no overlap, no compute:
//   disk read            bytes / disk_read_bw   (into the page cache)
//   RAM copy             bytes / ram_copy_bw    (page cache or LoRA RAM into a new pin;
//                                                the staging copy of a pageable transfer)
//   host to device       bytes / h2d_bw         (from a page-locked pin)
// A pin fill costs its source read + one RAM copy + the device copy; a hit the
// device copy (plus a RAM copy when the registration ceiling dropped its page
// lock); a cast the budget refused is a pageable copy: source read + RAM copy +
// device copy.
//
// Note [Simulator lru]
// lru models the usual application, which pins streamed weights and leaves
// loaded ones to the page cache: streamed weights (and patches) go through the
// Balancer with policy lru (evict the least recently used pin); device-resident
// ones never ask for a pin and are copied from the page cache, which is how
// those applications load a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "csrc/config/config.h"
#include "profiling/sim/expand.h"
#include "profiling/sim/trace.h"

namespace pins::sim {

struct RunResult {
  int run = 0;  // 0-based
  int prompt = 0;
  uint64_t disk_bytes = 0;
  uint64_t page_cache_hit_bytes = 0;
  int64_t pin_hits = 0;     // COUNT accesses served from a pin
  int64_t pin_misses = 0;   // COUNT accesses no pin served: pin_fills + refusals
  int64_t pin_fills = 0;    // COUNT pins created (the bytes came from the page cache or disk)
  int64_t refusals = 0;     // COUNT casts copied straight from the source
  uint64_t pin_hit_bytes = 0;
  uint64_t h2d_bytes = 0;
  uint64_t pageable_h2d_bytes = 0;
  uint64_t evicted_bytes = 0;
  uint64_t pinned_bytes = 0;  // level at the end of the run
  int64_t monitor_reliefs = 0;  // COUNT reliefs the modelled pressure monitor ran (ReplayOptions::monitor)
  double disk_s = 0, copy_s = 0, h2d_s = 0;
  double time_s() const { return disk_s + copy_s + h2d_s; }
};

struct PolicyResult {
  std::string policy;
  std::vector<RunResult> runs;
  int steady_run = -1;  // 0-based first run of the steady state; -1: not reached within the runs
};

struct ReplayOptions {
  bool relieve = true;         // Balancer::relieve() after set_active and end_prompt, as ops/ does (DESIGN.md "Budget")
  bool mark_upfront = true;    // mark_prompt(all the prompt's models) at its start; else each model at its first step
  // A pin of a weight is filled from its file as pins.load_file's are: from
  // the page cache when it holds the weight (which then drops it), else from
  // the disk past the cache. False: through the page cache, as a plain read.
  bool direct_fills = true;
  // The pressure monitor, on by default as in the runtime, modelled as checking
  // after every cast, the soonest it could: below Balancer::pressure_line()
  // (Note [Pressure from others]), it runs relieve(). Nothing but pins moves
  // RAM inside a node here, so it fires only where a pin took available RAM
  // past its own reserve line (a block that could not reuse the idle extents
  // its admission counted as room): twice over every bundled trace, sequence
  // and policy; RunResult::monitor_reliefs counts it.
  bool monitor = true;
  // The monitor's line the headroom itself, as before Note [Pressure from
  // others]: it then frees pins' own growth into their slack within the node.
  bool monitor_at_headroom = false;
  // Balancer::set_device_bytes as ComfyUI's integration calls it (Note
  // [Spared layers on the device]): each model's weight bytes on the device,
  // when they changed, after the unloads that make room for a step (before its
  // copies) and after its own load. False: the application says nothing.
  bool device_bytes = true;
  std::string conf;            // PINS_CONF-syntax overrides of the balancer's Config
};

// policy: "lru", "mru", "trace", "reuse" (the Balancer), "clairvoyant" (the Balancer
// with the reuse policy told every next use: ReuseHistory::set_future), "oracle" or
// "oracle-pins".
PolicyResult replay(const Trace& trace, const Sequence& sequence, const Expansion& e, const std::string& policy,
                    const ReplayOptions& options = {});

// Note [Simulator oracle]
// Belady over the weight accesses with capacity K_r in run r: on a miss the
// weight is read from disk; it is kept, evicting the cached weights whose next
// use is farthest (never-again first, larger first on a tie), unless one of
// those is needed before it (then it bypasses the cache). Patches are never
// cached (their source is RAM). One cache, no page cache besides it.
//   "oracle"       K_r = M_r, the RAM capacity (RAM - other_ram - LoRA bytes):
//                  every byte the policies can hold, pins and page cache
//                  together (Note [Simulator memory model]), so no policy beats
//                  it; the yardstick of the results and of --suite.
//   "oracle-pins"  K_r = P_r, the pin capacity (M_r less the headroom): the
//                  best a cache of exactly the pins kept between runs can do.
//                  The balancer pins past P inside a node and has the page
//                  cache, so mru and trace beat it where one model does not fit.
enum class OracleCapacity { Ram, Pins };
PolicyResult replay_oracle(const Trace& trace, const Expansion& e, OracleCapacity capacity = OracleCapacity::Ram);

// Note [Simulator steady state]: the first run r from which every run s repeats
// run s + period within `tolerance` bytes of disk reads; -1 when the runs end first.
int steady_run(const Sequence& sequence, const std::vector<RunResult>& runs, uint64_t tolerance);
uint64_t steady_tolerance(const Expansion& e);

}  // namespace pins::sim
