// Checks for the torch-free core. The ops translate these exceptions into
// torch errors (c10::Error / c10::ValueError) at the boundary.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace pins {

// Bad input from a user: a configuration key, an argument. The message names the
// argument and the value it got.
struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A request that could not be served (the cap refused an allocation, the OS
// refused memory). Nothing was changed.
struct ResourceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace pins

// PINS_CHECK_VALUE(cond, "x must be positive, got ", x): throws pins::ValueError.
#define PINS_CHECK_VALUE(cond, ...)                                      \
  do {                                                                   \
    if (!(cond)) throw ::pins::ValueError(::pins::detail::cat(__VA_ARGS__)); \
  } while (0)

// PINS_ASSERT(cond, ...): a broken invariant, i.e. a bug in pins itself.
#define PINS_ASSERT(cond, ...)                                                  \
  do {                                                                          \
    if (!(cond))                                                                \
      throw std::logic_error(::pins::detail::cat(                               \
          "pins internal assert failed at " __FILE__ ":", __LINE__, ": " #cond, \
          " ", ##__VA_ARGS__));                                                 \
  } while (0)
