// The one TORCH_LIBRARY of pins. Each op defines itself from its own file with
// TORCH_LIBRARY_FRAGMENT(pins, m) beside its kernel and its C++ entry point
// (declared in include/pins/ops/<op>.h, gathered by include/pins/ops.h), so
// adding an op touches no shared file.
//
// Note [Error types]
// One rule for every op:
// - A bad value of an argument or of the configuration (a source on the wrong
//   device, of the wrong layout or quantized; an unknown kind; a negative byte
//   count; an id that names no registered model; PINS_CONF or configure() text
//   with an unknown key or a bad value) is TORCH_CHECK_VALUE: c10::ValueError,
//   ValueError in Python. The core throws pins::ValueError for these, and
//   translate() (ops/common.h) turns it into c10::ValueError.
// - A request that cannot be served in the current state (/proc/meminfo
//   unreadable, the monitor thread could not start) is TORCH_CHECK: c10::Error,
//   RuntimeError in Python. The core throws pins::ResourceError for these.
// Either message names the argument (or key) and the value it got. A broken
// invariant (a bug in pins) is PINS_ASSERT or TORCH_INTERNAL_ASSERT, a
// RuntimeError in Python. c10::ValueError derives from c10::Error: C++ code that
// catches c10::Error catches both. Inside a TorchScript function torch's
// interpreter re-raises either as a RuntimeError carrying the same message.
#include <torch/library.h>

TORCH_LIBRARY(pins, m) {
  // Fake (meta) kernels live in Python (python_bindings/torch_pins/_fake.py): torch
  // imports that module when tracing needs them.
  m.set_python_module("torch_pins._fake");
}
