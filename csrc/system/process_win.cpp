#include "csrc/system/process.h"

#include <windows.h>

namespace pins {

int process_id() { return static_cast<int>(GetCurrentProcessId()); }

// No fork() on Windows (process.h): every process is generation 0.
uint64_t fork_generation() { return 0; }

int at_fork(void (*)(), void (*)(), void (*)()) { return 0; }

}  // namespace pins
