// Small text helpers shared by every parser in pins (configuration, traces,
// /proc and /sys files).
#pragma once

#include <string>
#include <string_view>

namespace pins {

// `s` without leading and trailing white space.
std::string_view trim(std::string_view s);

// `s` in ASCII lower case.
std::string lower(std::string_view s);

}  // namespace pins
