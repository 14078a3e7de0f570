// The tag torch gives its own out= overloads: at::Tag::out where the release
// has it (torch.compile's out-variant handling looks for it), at::Tag::out_variant
// in releases before it (torch 2.11). Chosen at compile time, so one source
// builds for both; header-only, so the op tests check the same tag.
#pragma once

#include <ATen/core/enum_tag.h>

namespace pins::ops {

template <typename T = at::Tag>
constexpr T out_tag() {
  if constexpr (requires { T::out; }) {
    return T::out;
  } else {
    return T::out_variant;
  }
}

}  // namespace pins::ops
