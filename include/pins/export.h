// PINS_API marks what libpins.so exports: the C++ entry points of the ops
// (include/pins/ops/). Everything else in the library, the core included, is
// hidden (CMakeLists.txt: the visibility preset), so an app links against these
// and nothing else, and the library's own copy of the core never clashes with
// another in the process.
#pragma once

#if defined(_WIN32)
#define PINS_API __declspec(dllexport)
#else
#define PINS_API __attribute__((visibility("default")))
#endif
