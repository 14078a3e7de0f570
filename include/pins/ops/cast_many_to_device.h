// pins::cast_many_to_device (ops/cast_many_to_device.cpp,
// Note [Gathered pins]).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <vector>

#include <pins/export.h>

namespace pins::ops {

// Copies `sources` (CPU, dense, non-quantized tensors; their dtypes may differ)
// to `device` as cast_to_device does each, but through ONE pin holding all of
// them and ONE transfer into one device buffer, and returns the results in
// order, each converted to `dtype` when given. No two results share a storage
// (a custom op's rule): the first stays a view of that buffer when it needs no
// conversion, the others are copied out of it on the device (pass the largest
// source first). The same group of
// sources hits the same pin; any part written in place, invalidated or with
// another signature makes the group stale. `model`, `kind`, `resident` and
// `signature` mean what they mean for cast_to_device and apply to the group. An
// undefined tensor in `sources`, or any other bad value, is a c10::ValueError
// naming it. `cast_many_to_device({w, b}, dev)` works (Tensor[] is
// at::TensorList).
PINS_API std::vector<at::Tensor> cast_many_to_device(at::TensorList sources, c10::Device device,
                                            std::optional<c10::ScalarType> dtype = std::nullopt,
                                            bool non_blocking = false, int64_t model = -1,
                                            c10::string_view kind = "weights", bool resident = false,
                                            std::optional<int64_t> signature = std::nullopt);

}  // namespace pins::ops
