// The C++ entry points of the pins ops: the header a C++ app includes.
//
// One header per op (or per group of ops defined in one file), as torchvision's
// csrc/ops/ops.h. Each entry point calls its op through the dispatcher (the
// typed handle cached in a static), so C++, Python and TorchScript run the same
// kernel. Bad argument values throw c10::ValueError (Python ValueError); a
// request that cannot be served in the current state throws c10::Error
// (RuntimeError). Both name what was wrong.
#pragma once

#include <pins/ops/cast_many_to_device.h>  // IWYU pragma: export
#include <pins/ops/cast_to_device.h>       // IWYU pragma: export
#include <pins/ops/configure.h>            // IWYU pragma: export
#include <pins/ops/free_pins.h>            // IWYU pragma: export
#include <pins/ops/invalidate.h>           // IWYU pragma: export
#include <pins/ops/load_file.h>            // IWYU pragma: export
#include <pins/ops/models.h>               // IWYU pragma: export
#include <pins/ops/prompt.h>               // IWYU pragma: export
#include <pins/ops/stats.h>                // IWYU pragma: export
