// What every Windows file of the core's operating-system layer needs (built on
// Windows only; csrc/*/*_win.cpp).
#pragma once

#include <string>

namespace pins::win32 {

// The system's message for a Win32 error code (GetLastError()), with the code:
// "Access is denied. (error 5)".
std::string error_text(unsigned long code);

// `utf8` in UTF-16, as the wide Win32 calls take paths. Bytes that are not
// UTF-8 become U+FFFD.
std::wstring widen(const std::string& utf8);

}  // namespace pins::win32
