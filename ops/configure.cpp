// pins::configure: PINS_CONF syntax, applied on top of the current settings. A
// bad text is a c10::ValueError naming the key and value; a monitor that cannot
// start is a c10::Error (Note [Error types] in ops/library.cpp). pins::config:
// the settings in force, in the same syntax.
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

std::string config_kernel() {
  return translate([&] { return format_config(Runtime::get().config()); });
}

static_assert(std::is_same_v<decltype(configure_kernel), decltype(configure)>);
static_assert(std::is_same_v<decltype(config_kernel), decltype(config)>);

}  // namespace

void configure(c10::string_view conf) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::configure", "").typed<decltype(configure)>();
  op.call(conf);
}

std::string config() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::config", "").typed<decltype(config)>();
  return op.call();
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("configure(str conf) -> ()", &pins::ops::configure_kernel);
  m.def("config() -> str", &pins::ops::config_kernel);
}
