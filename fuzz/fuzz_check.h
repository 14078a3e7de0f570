// What the fuzz targets share: a property check that aborts (libFuzzer then
// saves the input) with a message naming the property.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define PINS_FUZZ_CHECK(cond, what)                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "fuzz property violated: %s (%s)\n", #cond, std::string(what).c_str()); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
