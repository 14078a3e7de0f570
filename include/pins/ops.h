// C++ entry points of the pins ops. Each calls through the dispatcher (the typed
// handle cached in a static), so C++, Python and TorchScript run the same path.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <ATen/core/Dict.h>

#include <optional>
#include <string>
#include <vector>

namespace pins::ops {

int64_t register_model(const std::string& name, c10::Device load_device);
void forget_model(int64_t model);
void set_active(int64_t model, bool active);
void mark_prompt(const std::vector<int64_t>& models);
void end_prompt();
at::Tensor cast_to_device(const at::Tensor& source, c10::Device device,
                          std::optional<c10::ScalarType> dtype = std::nullopt, bool non_blocking = false,
                          int64_t model = -1, const std::string& kind = "weights", bool resident = false,
                          std::optional<int64_t> signature = std::nullopt);
int64_t free_pins(int64_t bytes, bool evict_active = false);
c10::Dict<std::string, int64_t> stats();
void configure(const std::string& conf);

}  // namespace pins::ops
