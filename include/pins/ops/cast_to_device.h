// pins::cast_to_device and pins::cast_to_device.out
// (ops/cast_to_device.cpp, Note [Cast path]).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>

#include <pins/export.h>

namespace pins::ops {

// Copies `source` (a CPU, dense, non-quantized tensor) to `device`, converted to
// `dtype` if given, through its pin. `model == -1` is a plain copy; otherwise
// `model` is a registered model id. `kind` is "weights" or "patches";
// `signature` names a patch set (patches) or the content of a weight (weights):
// a pin made under another signature is stale. `resident`: the copy stays on
// the device. A bad value of any argument is a c10::ValueError naming it.
// The parameter types are the schema's own (str is c10::string_view): the entry
// point calls the dispatcher typed with decltype(cast_to_device).
PINS_API at::Tensor cast_to_device(const at::Tensor& source, c10::Device device,
                          std::optional<c10::ScalarType> dtype = std::nullopt, bool non_blocking = false,
                          int64_t model = -1, c10::string_view kind = "weights", bool resident = false,
                          std::optional<int64_t> signature = std::nullopt);

// The out= overload, `cast_to_device.out`: writes what cast_to_device returns
// into `out` (on `device`, of the source's shape, of dtype `dtype` or else the
// source's; anything else is a c10::ValueError naming out), on the current
// stream, and returns `out`. As ATen's out functions: cast_to_device_out takes
// `out` first (the rest may default), cast_to_device_outf takes it last, in
// schema order (its type is the schema's).
PINS_API at::Tensor& cast_to_device_outf(const at::Tensor& source, c10::Device device, std::optional<c10::ScalarType> dtype,
                                bool non_blocking, int64_t model, c10::string_view kind, bool resident,
                                std::optional<int64_t> signature, at::Tensor& out);
PINS_API at::Tensor& cast_to_device_out(at::Tensor& out, const at::Tensor& source, c10::Device device,
                               std::optional<c10::ScalarType> dtype = std::nullopt, bool non_blocking = false,
                               int64_t model = -1, c10::string_view kind = "weights", bool resident = false,
                               std::optional<int64_t> signature = std::nullopt);

}  // namespace pins::ops
