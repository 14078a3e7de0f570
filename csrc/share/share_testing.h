// Seams only tests set (Note [Shared pins] on Linux): production code never
// includes this header, and with nothing set every call does what it says.
#pragma once

#include <sys/types.h>

namespace pins::share::testing {

// Replaces posix_fallocate for the index and the segments: returns 0 or an
// errno (ENOSPC: the tmpfs is full). Null restores posix_fallocate.
void set_reserve(int (*reserve)(int fd, off_t length));

// Called in the thread that just took the index lock, with it held: the chaos
// test stops a process there (SIGSTOP), as a debugger or a cgroup freezer
// would. Null: nothing.
void set_on_locked(void (*hook)());

}  // namespace pins::share::testing
