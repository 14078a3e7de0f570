// pins::configure: PINS_CONF syntax, applied on top of the current settings. A
// bad text is a c10::ValueError naming the key and value; a monitor that cannot
// start is a c10::Error (Note [Error types] in ops/library.cpp). pins::config:
// the settings in force, in the same syntax; pins::config_sources: where each
// came from (Runtime::config_sources), in the same syntax.
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

std::string config_sources_kernel() {
  return translate([&] {
    std::string out;
    for (const auto& [key, source] : Runtime::get().config_sources())
      out += detail::cat(out.empty() ? "" : ",", key, ":", source);
    return out;
  });
}

static_assert(std::is_same_v<decltype(configure_kernel), decltype(configure)>);
static_assert(std::is_same_v<decltype(config_kernel), decltype(config)>);
static_assert(std::is_same_v<decltype(config_sources_kernel), decltype(config_sources)>);

}  // namespace

void configure(c10::string_view conf) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::configure", "").typed<decltype(configure)>();
  op.call(conf);
}

std::string config() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::config", "").typed<decltype(config)>();
  return op.call();
}

std::string config_sources() {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::config_sources", "").typed<decltype(config_sources)>();
  return op.call();
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("configure(str conf) -> ()", &pins::ops::configure_kernel);
  m.def("config() -> str", &pins::ops::config_kernel);
  m.def("config_sources() -> str", &pins::ops::config_sources_kernel);
}
