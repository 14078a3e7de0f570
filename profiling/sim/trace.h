// A workflow trace: the modelled machine, the models with their layers, the
// LoRAs, the prompts and the sequences of prompts that the simulator replays.
// The file format is documented in docs/SIMULATOR.md ("Trace format").
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "profiling/data/model_params.h"

namespace pins::sim {

// A trace file that does not follow the format. The message starts with the
// file and the field, e.g. `wan.json: prompts[1].steps[0].model: unknown model "x"`.
struct TraceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Machine {
  uint64_t ram = 0;           // R: total host RAM
  uint64_t vram = 0;          // device memory
  double disk_read_bw = 0;    // bytes/s, through the page cache (mmap)
  double ram_copy_bw = 0;     // bytes/s, one RAM-to-RAM copy (pin fill, pageable staging)
  double h2d_bw = 0;          // bytes/s, host-to-device from page-locked memory
  uint64_t headroom = 0;      // the balancer's headroom (Config::headroom)
  bool headroom_derived = false;  // the trace sets none: derive_budget(ram) gives it (Note [Derived budget])
  uint64_t other_ram = 0;     // RAM the OS, the desktop and the application hold outside pins and page cache
  uint64_t swap = 0;          // swap size (the pin ceiling reads it)
  uint64_t vram_reserve = 0;  // device memory never given to weights (the app's minimum inference memory)
};

struct Layer {
  std::string name;
  uint64_t bytes = 0;
};

struct Model {
  std::string name;
  std::vector<Layer> layers;     // execution order
  uint64_t bytes = 0;            // sum of the layers
  uint64_t inference_bytes = 0;  // device memory its forward pass needs besides weights
  uint64_t largest_layer = 0;
};

// A patch set (LoRA) for one model: factor tensors, one per patched layer,
// `bytes` in all, split over the patched layers in proportion to their size.
struct Lora {
  std::string name;
  int model = -1;  // index into Trace::models
  uint64_t bytes = 0;
  std::vector<std::string> targets;   // layer-name prefixes it patches; empty: every layer
  std::vector<uint64_t> layer_bytes;  // per layer of the model; 0: not patched
};

// One node that runs a model: `steps` forward passes (sampler steps; 1 for a
// text encoder or a VAE) with the given LoRAs applied.
struct Step {
  int model = -1;
  int steps = 1;
  std::vector<int> loras;  // indices into Trace::loras, all for `model`
};

struct Prompt {
  std::string name;
  std::vector<Step> steps;
};

// Runs prompts[i] for run i (0-based) while i < prompts.size(), then cycles
// through prompts[repeat_from..].
struct Sequence {
  std::string name;
  std::string description;
  std::vector<int> prompts;  // indices into Trace::prompts
  int repeat_from = 0;
  int runs = 6;                  // default number of runs
  int prompt_at(int run) const;  // run is 0-based
  int period() const { return static_cast<int>(prompts.size()) - repeat_from; }
};

struct Trace {
  std::string path;
  std::string name;
  std::string description;
  std::vector<std::string> sources;
  Machine machine;
  std::vector<Model> models;
  std::vector<Lora> loras;
  std::vector<Prompt> prompts;
  std::vector<Sequence> sequences;

  int model_index(const std::string& name) const;           // -1 when absent
  const Sequence& sequence(const std::string& name) const;  // throws TraceError listing the names
  uint64_t largest_layer() const;
  uint64_t total_weight_bytes() const;
};

// Reads and validates a trace file. `params_csv` is the model parameter list
// that `"params"` layer specs refer to; empty: the trace's own "params_file"
// (relative to the trace) or model_params::default_path().
Trace load_trace(const std::string& path, const std::string& params_csv = "");
// The same from text; `origin` names it in errors.
Trace parse_trace(const std::string& text, const std::string& origin, const std::string& params_csv = "");

// Overrides one machine field: "other_ram=6GiB", "h2d_bw=25GB/s". Throws
// std::invalid_argument naming the field and the value.
void set_machine_field(Machine& m, const std::string& assignment);

// A bandwidth: a positive number with a unit of Note [Size syntax] (csrc/base/size.h)
// and an optional "/s": "3GB/s" = 3e9, "25 GiB/s", "500MB" -> bytes per second;
// nullopt when `text` is not one.
std::optional<double> parse_bandwidth(std::string_view text);

// The layers of a model in a parameter list, grouped as `group` asks:
//   "tensor"  one layer per tensor
//   "module"  one per module (the tensor name less its last component)
//   "block"   one per block: the name up to its first numeric component
//             ("blocks.7", "down_blocks.2"), or the first component when it has
//             none ("conv_in", "head"); a block larger than `max_layer_bytes`
//             is split at the next numeric component, recursively
// Consecutive tensors only: a group never spans a gap in the file's order.
std::vector<Layer> group_layers(const std::vector<model_params::Tensor>& tensors, const std::string& group,
                                uint64_t bytes_per_param, uint64_t max_layer_bytes);

}  // namespace pins::sim
