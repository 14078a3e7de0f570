// The expansion rule: how the prompts of a sequence become the host-to-device
// copies ("pin accesses") an application makes. It mirrors ComfyUI's model
// management (comfy/model_management.py load_models_gpu and free_memory,
// comfy/model_patcher.py load and partially_unload); docs/SIMULATOR.md
// ("The expansion rule") states it in full. The expansion depends on the trace
// only, never on the pin policy, so every policy replays the same accesses.
//
// Note [Simulator lower bound]
// For run r: W_r = bytes of the distinct weights its models use; kept_r = those
// it finds in VRAM from before the run and never copies; copied_r = W_r - kept_r;
// cold_r = copied weights no earlier run copied; P_r = the pin capacity, RAM -
// other_ram - the run's LoRA bytes - headroom; C_r = P_r + kept_r. At the start
// of the run the pins hold at most P_r bytes of weights, and a cold weight is in
// no cache at all, so the run reads at least
//   LB_r = cold_r + max(0, copied_r - cold_r - P_r)
// from disk; on a steady run (cold_r = 0) that is DESIGN.md's max(0, W - C).
// That is the pin bound: it counts what the pins keep between runs. The
// policies hold more than P: inside a node the balancer pins until available
// RAM falls to max(headroom/2, pin_reserve), and the page cache holds weights
// in whatever RAM the pins leave (Note [Simulator memory model] in replay.h).
// Pins and page cache together never exceed M_r = RAM - other_ram - the run's
// LoRA bytes (the RAM capacity), so the same argument with M_r in place of P_r,
//   RLB_r = cold_r + max(0, copied_r - cold_r - M_r),
// is a bound no policy of the simulator can beat (the RAM bound); the honest
// oracle (Belady at M_r) is measured against it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "csrc/balancer/registry.h"
#include "profiling/sim/trace.h"

namespace pins::sim {

struct Access {
  int run = 0;     // 0-based
  int step = 0;    // index of the step within its prompt
  int model = 0;   // index into Trace::models
  int layer = 0;   // index into the model's layers
  int lora = -1;   // a patch tensor of this LoRA; -1: the weight itself
  uint64_t storage = 0;  // the pin key's storage id (offset 0, nbytes = bytes)
  uint64_t bytes = 0;
  Kind kind = Kind::Weights;
  bool resident = false;  // the copy stays on the device
  std::optional<int64_t> signature;  // patch set (patches only)
  Subset subset() const;  // where a new pin would go (fast-disk off, policy mru)
};

struct StepPlan {
  int step = 0;
  int model = 0;
  int passes = 1;
  size_t begin = 0, end = 0;  // its accesses
  uint64_t vram_used_after = 0;  // weights in VRAM after the step's load
  // Each model's weight bytes on the device after the step's load (the other
  // models' after what the step unloaded, before its copies).
  std::vector<uint64_t> device_after;
};

// Note [Simulator lower bound]
struct RunBound {
  uint64_t used = 0;      // W
  uint64_t copied = 0;    // distinct weights copied from host
  uint64_t kept = 0;      // found in VRAM from before the run
  uint64_t cold = 0;      // copied, and never copied by an earlier run
  uint64_t app_ram = 0;   // other_ram + the run's LoRA bytes
  uint64_t pin_capacity = 0;  // P
  uint64_t ram_capacity = 0;  // M = RAM - app_ram: pins and page cache together
  uint64_t cache = 0;     // C = P + kept
  uint64_t lower_bound = 0;      // the pin bound (P)
  uint64_t ram_lower_bound = 0;  // the RAM bound (M): no policy reads less
  uint64_t resident_copy_bytes = 0;  // weight bytes copied to stay on the device
  uint64_t streamed_bytes = 0;       // weight bytes copied for one forward pass
};

struct RunPlan {
  int run = 0;
  int prompt = 0;
  std::vector<int> models;  // the prompt's models, in first-use order
  std::vector<StepPlan> steps;
  RunBound bound;
  std::vector<std::pair<uint64_t, uint64_t>> copied_keys;  // (storage, bytes) of the distinct weights copied
};

struct Expansion {
  std::vector<Access> accesses;
  std::vector<RunPlan> runs;
};

Expansion expand(const Trace& trace, const Sequence& sequence, int runs);

// Note [Simulator lower bound], over `count` runs from `first` (a cycle of an
// alternating sequence): the pins hold at most min P at the window's start, so
// the window reads at least cold + max(0, distinct copied - cold - min P); and
// at least the sum of its runs' bounds. Returns the larger. `ram`: the same
// with M and the RAM bounds (the bound no policy beats).
uint64_t window_bound(const Expansion& e, int first, int count, bool ram = false);

// The pin key storage id of a weight or of a LoRA's patch tensor.
uint64_t weight_storage(int model, int layer);
uint64_t patch_storage(int lora, int layer);
// "wan_high/blocks.7", "lora:style/wan_high/blocks.7"
std::string key_name(const Trace& trace, const Access& a);

}  // namespace pins::sim
