// The process across fork(), for Note [Fork safety] (csrc/runtime/runtime.h)
// and Note [Monitor across fork] (csrc/system/monitor.h): process_linux.cpp,
// and process_win.cpp where there is no fork() (a new process starts from its
// own image and inherits none of this one's memory), so nothing is inherited
// and nothing needs handlers.
#pragma once

#include <cstdint>

namespace pins {

// This process's id.
int process_id();

// How many fork() children deep this process is: counted by a handler in each
// child (async-signal-safe: one atomic add), registered by the first call. 0
// on Windows. Throws pins::ResourceError when the handler cannot be registered.
uint64_t fork_generation();

// Registers handlers to run around every fork() (pthread_atfork): 0, or the
// errno-style code of the refusal. Windows: nothing to register, 0.
int at_fork(void (*prepare)(), void (*in_parent)(), void (*in_child)());

}  // namespace pins
