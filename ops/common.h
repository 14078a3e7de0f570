// What every op needs: the runtime, and the translation of the core's
// exceptions into torch errors (ValueError or RuntimeError in Python, naming
// what was wrong: Note [Error types] in ops/library.cpp).
#pragma once

#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

#include <utility>

#include "allocator/host_allocator.h"
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

// The process-wide balancer, over a pool whose blocks hold bytes (torch_pool()
// refuses backend:null, naming the key).
inline Balancer& balancer() {
  torch_pool();
  return Runtime::get().balancer();
}

// The C++ type of a kernel that takes its DispatchKeySet first (to redispatch
// below itself): the entry point's type F with c10::DispatchKeySet prepended.
template <typename F>
struct WithKeySet;
template <typename R, typename... Args>
struct WithKeySet<R(Args...)> {
  using type = R(c10::DispatchKeySet, Args...);
};
template <typename F>
using with_keyset_t = typename WithKeySet<F>::type;

}  // namespace pins::ops
