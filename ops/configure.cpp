// pins::configure: PINS_CONF syntax, applied on top of the current settings. A
// bad text is a c10::ValueError naming the key and value; a monitor that cannot
// start is a c10::Error (Note [Error types] in ops/library.cpp).
#include <pins/ops/configure.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <type_traits>

#include "ops/common.h"

namespace pins::ops {
namespace {

void configure_kernel(c10::string_view conf) {
  translate([&] { Runtime::get().configure(conf); });
}

static_assert(std::is_same_v<decltype(configure_kernel), decltype(configure)>);

}  // namespace

void configure(c10::string_view conf) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::configure", "").typed<decltype(configure)>();
  op.call(conf);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("configure(str conf) -> ()", &pins::ops::configure_kernel);
}
