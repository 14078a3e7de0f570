// pins::register_model, pins::forget_model, pins::set_active,
// pins::set_device_bytes (ops/models.cpp). An id that names no registered
// model is a c10::ValueError naming it.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/string_view.h>

#include <cstdint>

#include <pins/export.h>

namespace pins::ops {

// Registers a model (weights that load and unload together) whose weights are
// cast to `load_device`, and returns its id. `fast_disk`: its weights reload
// fast from disk, so it gets no -loaded pins (as the fast_disk key of the
// configuration, for this model only). `size`: the bytes of its weights when
// known, what its first prompt is expected to pin (Note [Prewarm] in
// csrc/balancer/prewarm.h: memory for them is committed ahead); 0, unknown. An
// empty `name` or a negative `size` is a c10::ValueError; names may repeat
// (pins::stats then tells them apart by id).
PINS_API int64_t register_model(c10::string_view name, c10::Device load_device, bool fast_disk = false,
                                int64_t size = 0);

// Forgets `model` and frees all its pins.
PINS_API void forget_model(int64_t model);

// Marks `model` as executing now (or no longer), then runs the RAM-pressure
// check; a model becoming active wakes the prewarm (Note [Prewarm]).
PINS_API void set_active(int64_t model, bool active);

// Says that `bytes` of `model`'s `total` bytes of weights are on its device
// now (more than `total` counts as `total`): the application's loads and
// unloads, which pins does not see (Note [Spared layers on the device] in
// csrc/balancer/pin_table.h; ComfyUI's integration reports
// ModelPatcher.loaded_size() of model_size() after each). A negative count is
// a c10::ValueError.
PINS_API void set_device_bytes(int64_t model, int64_t bytes, int64_t total);

}  // namespace pins::ops
