// pins::stats: every counter of the balancer and the pool as a dict.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "ops/common.h"
#include <pins/ops.h>

namespace pins::ops {
namespace {

c10::Dict<std::string, int64_t> stats_kernel() {
  return translate([] {
    Runtime& rt = Runtime::get();
    c10::Dict<std::string, int64_t> d;
    for (const auto& [k, v] : rt.balancer().stats()) d.insert(k, v);
    d.insert(std::string("backend.") + rt.pool().stats().backend, 1);
    d.insert("monitor", rt.monitor_running() ? 1 : 0);
    return d;
  });
}

}  // namespace

c10::Dict<std::string, int64_t> stats() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pins::stats", "")
                       .typed<c10::Dict<std::string, int64_t>()>();
  return op.call();
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("stats() -> Dict(str, int)", &pins::ops::stats_kernel);
}
