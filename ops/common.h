// What every op needs: the runtime, and the translation of the core's
// exceptions into torch errors (ValueError or RuntimeError in Python, naming
// what was wrong: Note [Error types] in ops/library.cpp).
#pragma once

#include <c10/util/Exception.h>

#include <utility>

#include "csrc/base/check.h"
#include "csrc/runtime/runtime.h"

namespace pins::ops {

template <typename F>
auto translate(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const pins::ValueError& e) {
    TORCH_CHECK_VALUE(false, e.what());  // Note [Error types] (ops/library.cpp)
  } catch (const pins::ResourceError& e) {
    TORCH_CHECK(false, e.what());
  }
}

inline Balancer& balancer() {
  return translate([]() -> Balancer& { return Runtime::get().balancer(); });
}

}  // namespace pins::ops
