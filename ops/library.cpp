// The one TORCH_LIBRARY of pins. Each op adds itself from its own folder with
// TORCH_LIBRARY_FRAGMENT(pins, m) beside its kernels (see ops/README.md), so
// adding an op touches no shared file.
#include <torch/library.h>

TORCH_LIBRARY(pins, m) {}
