// The one TORCH_LIBRARY of pins. Each op defines itself from its own folder with
// TORCH_LIBRARY_FRAGMENT(pins, m) beside its kernel, so adding an op touches no
// shared file.
#include <torch/library.h>

TORCH_LIBRARY(pins, m) {
  // Fake (meta) kernels live in Python (python_bindings/torch_pins/_fake.py): torch
  // imports that module when tracing needs them.
  m.set_python_module("torch_pins._fake");
}
