// pins::mark_prompt, pins::end_prompt and pins::end_node: the prompt and node
// boundaries. An id that names
// no registered model is a c10::ValueError, and mark_prompt then marks none
// (Note [Error types] in ops/library.cpp).
#include <pins/ops/prompt.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "ops/common.h"

namespace pins::ops {
namespace {

void mark_prompt_kernel(c10::IntArrayRef models) {
  translate([&] {
    balancer().mark_prompt(std::vector<ModelId>(models.begin(), models.end()));
    if (!models.empty()) Runtime::get().wake_prewarm();  // Note [Prewarm]: the prompt names what it runs
  });
}

void end_prompt_kernel() {
  translate([&] {
    Balancer& b = balancer();
    b.end_prompt();
    b.reclaim(Balancer::kReclaimPerBoundary);  // pins of dead sources (Note [Dead source reclaim])
    b.relieve();  // the RAM-pressure check
  });
}

void end_node_kernel() {
  translate([&] {
    Balancer& b = balancer();
    b.end_node();  // drops `patches`, clears `active`; the prompt goes on
    b.reclaim(Balancer::kReclaimPerBoundary);  // pins of dead sources (Note [Dead source reclaim])
    b.relieve();   // the RAM-pressure check
  });
}

static_assert(std::is_same_v<decltype(mark_prompt_kernel), decltype(mark_prompt)>);
static_assert(std::is_same_v<decltype(end_node_kernel), decltype(end_node)>);
static_assert(std::is_same_v<decltype(end_prompt_kernel), decltype(end_prompt)>);

}  // namespace

void mark_prompt(c10::IntArrayRef models) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::mark_prompt", "").typed<decltype(mark_prompt)>();
  op.call(models);
}

void end_prompt() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::end_prompt", "").typed<decltype(end_prompt)>();
  op.call();
}

void end_node() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::end_node", "").typed<decltype(end_node)>();
  op.call();
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("mark_prompt(int[] models) -> ()", &pins::ops::mark_prompt_kernel);
  m.def("end_prompt() -> ()", &pins::ops::end_prompt_kernel);
  m.def("end_node() -> ()", &pins::ops::end_node_kernel);
}
