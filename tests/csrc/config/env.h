// Sets and unsets environment variables (PINS_CONF) for a test: setenv where
// the C library has it, _putenv_s on Windows, which has not.
#pragma once

#include <stdlib.h>

namespace pins::testing {

inline int set_env(const char* name, const char* value) {
#if defined(_WIN32)
  return _putenv_s(name, value);
#else
  return ::setenv(name, value, 1);
#endif
}

inline void unset_env(const char* name) {
#if defined(_WIN32)
  _putenv_s(name, "");  // an empty value removes the variable
#else
  ::unsetenv(name);
#endif
}

}  // namespace pins::testing
