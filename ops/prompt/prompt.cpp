// pins::mark_prompt and pins::end_prompt (the prompt boundary).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "ops/common.h"
#include <pins/ops.h>

namespace pins::ops {
namespace {

void mark_prompt_kernel(c10::IntArrayRef models) {
  translate([&] { balancer().mark_prompt(std::vector<ModelId>(models.begin(), models.end())); });
}

void end_prompt_kernel() {
  translate([&] {
    Balancer& b = balancer();
    b.end_prompt();
    b.sweep();    // pins of sources that died during the prompt
    b.relieve();  // the RAM-pressure check
  });
}

}  // namespace

void mark_prompt(const std::vector<int64_t>& models) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::mark_prompt", "").typed<void(c10::IntArrayRef)>();
  op.call(models);
}

void end_prompt() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::end_prompt", "").typed<void()>();
  op.call();
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("mark_prompt(int[] models) -> ()", &pins::ops::mark_prompt_kernel);
  m.def("end_prompt() -> ()", &pins::ops::end_prompt_kernel);
}
