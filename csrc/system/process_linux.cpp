#include "csrc/system/process.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "csrc/base/check.h"

namespace pins {
namespace {

std::atomic<uint64_t> g_fork_generation{0};

void count_fork_in_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

int process_id() { return ::getpid(); }

uint64_t fork_generation() {
  static const int registered = ::pthread_atfork(nullptr, nullptr, &count_fork_in_child);
  if (registered != 0)
    throw ResourceError(detail::cat("PressureMonitor: pthread_atfork failed: ", std::strerror(registered)));
  return g_fork_generation.load(std::memory_order_relaxed);
}

int at_fork(void (*prepare)(), void (*in_parent)(), void (*in_child)()) {
  return ::pthread_atfork(prepare, in_parent, in_child);
}

}  // namespace pins
