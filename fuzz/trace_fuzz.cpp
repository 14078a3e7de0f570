// libFuzzer target: the simulator's trace parser (profiling/sim/trace.h,
// parse_trace) on any text. The parameter list is the repository's own CSV, so
// no input names a file to read. Properties beyond "no crash":
//  - the only exception is sim::TraceError (a trace that does not follow the
//    format), whatever the JSON;
//  - an accepted trace is self-consistent: every index (a step's model and
//    LoRAs, a LoRA's model, a sequence's prompts) is in range, each LoRA has
//    one share per layer of its model, each model's bytes sum its layers and
//    every sequence's prompt_at() stays in range over two periods.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "profiling/sim/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pins::sim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Trace t;
  try {
    t = parse_trace(text, "fuzz.json", PINS_FUZZ_PARAMS_CSV);
  } catch (const TraceError&) {
    return 0;
  }
  const int models = static_cast<int>(t.models.size());
  const int loras = static_cast<int>(t.loras.size());
  const int prompts = static_cast<int>(t.prompts.size());
  PINS_FUZZ_CHECK(models > 0 && prompts > 0 && !t.sequences.empty(), t.name);
  for (const Model& m : t.models) {
    uint64_t sum = 0, largest = 0;
    for (const Layer& l : m.layers) {
      sum += l.bytes;
      largest = std::max(largest, l.bytes);
    }
    PINS_FUZZ_CHECK(!m.layers.empty() && sum == m.bytes && largest == m.largest_layer, m.name);
  }
  for (const Lora& l : t.loras) {
    PINS_FUZZ_CHECK(l.model >= 0 && l.model < models, l.name);
    PINS_FUZZ_CHECK(l.layer_bytes.size() == t.models[l.model].layers.size(), l.name);
  }
  for (const Prompt& p : t.prompts) {
    PINS_FUZZ_CHECK(!p.steps.empty(), p.name);
    for (const Step& s : p.steps) {
      PINS_FUZZ_CHECK(s.model >= 0 && s.model < models && s.steps >= 1, p.name);
      for (int l : s.loras) PINS_FUZZ_CHECK(l >= 0 && l < loras && t.loras[l].model == s.model, p.name);
    }
  }
  for (const Sequence& s : t.sequences) {
    PINS_FUZZ_CHECK(!s.prompts.empty() && s.repeat_from >= 0 && s.repeat_from < static_cast<int>(s.prompts.size()),
                    s.name);
    for (int run = 0; run < 2 * static_cast<int>(s.prompts.size()); ++run) {
      const int p = s.prompt_at(run);
      PINS_FUZZ_CHECK(p >= 0 && p < prompts, s.name);
    }
  }
  return 0;
}
