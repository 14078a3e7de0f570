// pins::register_model, pins::forget_model, pins::set_active,
// pins::set_device_bytes: the models the balancer keeps pins for, and what
// the application says of them. Per-model options (ModelOptions in
// csrc/balancer/registry.h) are given at registration: fast_disk, the one
// setting of ComfyUI's ModelPatcher that maps to the balancer (its weights
// reload fast from disk: no -loaded pins for it), and size, the bytes of its
// weights (ModelPatcher.model_size()), which sizes the prewarm before its first
// prompt (Note [Prewarm] in csrc/balancer/prewarm.h). An id that names no registered model is a
// pins::ValueError from the balancer, a c10::ValueError here (Note [Error types]
// in ops/library.cpp).
#include <pins/ops/models.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <type_traits>

#include "ops/common.h"

namespace pins::ops {
namespace {

int64_t register_model_kernel(c10::string_view name, c10::Device load_device, bool fast_disk, int64_t size) {
  TORCH_CHECK_VALUE(!name.empty(), "register_model: name must not be empty");
  TORCH_CHECK_VALUE(size >= 0, "register_model: size must be a byte count >= 0, got ", size);
  ModelOptions options;
  options.fast_disk = fast_disk;
  options.size = static_cast<uint64_t>(size);
  return translate([&] { return balancer().register_model(std::string(name), load_device.str(), options); });
}

void forget_model_kernel(int64_t model) {
  translate([&] { balancer().forget_model(model); });
}

void set_active_kernel(int64_t model, bool active) {
  translate([&] {
    Balancer& b = balancer();
    b.set_active(model, active);
    b.relieve();  // a node boundary: the RAM-pressure check of DESIGN.md "Budget"
    if (active) Runtime::get().wake_prewarm();  // Note [Prewarm]: it runs next
  });
}

void set_device_bytes_kernel(int64_t model, int64_t bytes, int64_t total) {
  TORCH_CHECK_VALUE(bytes >= 0, "set_device_bytes: bytes must be a byte count >= 0, got ", bytes);
  TORCH_CHECK_VALUE(total >= 0, "set_device_bytes: total must be a byte count >= 0, got ", total);
  translate([&] { balancer().set_device_bytes(model, static_cast<uint64_t>(bytes), static_cast<uint64_t>(total)); });
}

static_assert(std::is_same_v<decltype(register_model_kernel), decltype(register_model)>);
static_assert(std::is_same_v<decltype(forget_model_kernel), decltype(forget_model)>);
static_assert(std::is_same_v<decltype(set_active_kernel), decltype(set_active)>);
static_assert(std::is_same_v<decltype(set_device_bytes_kernel), decltype(set_device_bytes)>);

}  // namespace

int64_t register_model(c10::string_view name, c10::Device load_device, bool fast_disk, int64_t size) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::register_model", "").typed<decltype(register_model)>();
  return op.call(name, load_device, fast_disk, size);
}

void forget_model(int64_t model) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::forget_model", "").typed<decltype(forget_model)>();
  op.call(model);
}

void set_active(int64_t model, bool active) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::set_active", "").typed<decltype(set_active)>();
  op.call(model, active);
}

void set_device_bytes(int64_t model, int64_t bytes, int64_t total) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::set_device_bytes", "").typed<decltype(set_device_bytes)>();
  op.call(model, bytes, total);
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("register_model(str name, Device load_device, bool fast_disk=False, int size=0) -> int",
        &pins::ops::register_model_kernel);
  m.def("forget_model(int model) -> ()", &pins::ops::forget_model_kernel);
  m.def("set_active(int model, bool active) -> ()", &pins::ops::set_active_kernel);
  m.def("set_device_bytes(int model, int bytes, int total) -> ()", &pins::ops::set_device_bytes_kernel);
}
