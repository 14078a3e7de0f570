// pins::configure: PINS_CONF syntax, applied on top of the current settings.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "ops/common.h"
#include <pins/ops.h>

namespace pins::ops {
namespace {

void configure_kernel(c10::string_view conf) {
  translate([&] { Runtime::get().configure(std::string_view(conf.data(), conf.size())); });
}

}  // namespace

void configure(const std::string& conf) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::configure", "").typed<void(c10::string_view)>();
  op.call(conf);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("configure(str conf) -> ()", &pins::ops::configure_kernel);
}
