// pins::register_model, pins::forget_model, pins::set_active.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "ops/common.h"
#include <pins/ops.h>

namespace pins::ops {
namespace {

int64_t register_model_kernel(c10::string_view name, c10::Device load_device) {
  TORCH_CHECK(!name.empty(), "register_model: name must not be empty");
  return translate([&] { return balancer().register_model(std::string(name), load_device.str()); });
}

void forget_model_kernel(int64_t model) {
  translate([&] { balancer().forget_model(model); });
}

void set_active_kernel(int64_t model, bool active) {
  translate([&] {
    Balancer& b = balancer();
    b.set_active(model, active);
    b.relieve();  // a node boundary: the RAM-pressure check of DESIGN.md "Budget"
  });
}

}  // namespace

int64_t register_model(const std::string& name, c10::Device load_device) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pins::register_model", "")
                       .typed<int64_t(c10::string_view, c10::Device)>();
  return op.call(name, load_device);
}

void forget_model(int64_t model) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::forget_model", "").typed<void(int64_t)>();
  op.call(model);
}

void set_active(int64_t model, bool active) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::set_active", "").typed<void(int64_t, bool)>();
  op.call(model, active);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("register_model(str name, Device load_device) -> int", &pins::ops::register_model_kernel);
  m.def("forget_model(int model) -> ()", &pins::ops::forget_model_kernel);
  m.def("set_active(int model, bool active) -> ()", &pins::ops::set_active_kernel);
}
