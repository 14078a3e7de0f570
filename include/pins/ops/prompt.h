// pins::mark_prompt, pins::end_prompt, pins::end_node (ops/prompt.cpp):
// the prompt and node boundaries.
#pragma once

#include <c10/util/ArrayRef.h>

#include <pins/export.h>

namespace pins::ops {

// Marks `models` as used by the current prompt, starting one if none runs. All
// or nothing: an id that names no registered model is a c10::ValueError and
// marks none. `mark_prompt({unet, vae})` works (int[] is c10::IntArrayRef).
PINS_API void mark_prompt(c10::IntArrayRef models);

// Ends the prompt: clears the marks, drops the patches pins and the pins of
// sources that died, then runs the RAM-pressure check.
PINS_API void end_prompt();

// A node boundary (what ComfyUI does after every node): drops the patches pins,
// clears `active` on every model, drops the pins of sources that died, then runs
// the RAM-pressure check. The prompt goes on: its marks and the trace policy's
// record stay.
PINS_API void end_node();

}  // namespace pins::ops
