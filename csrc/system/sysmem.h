// System memory as the balancer sees it: total RAM R, available RAM A, swap, and
// the cgroup limits (on Windows, the job object's) that bound both. See
// DESIGN.md "Budget".
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "csrc/config/config.h"

namespace pins {

struct MemoryInfo {
  uint64_t total = 0;       // R: MemTotal, bounded by the cgroup limit
  uint64_t available = 0;   // A: MemAvailable, bounded by the cgroup's limit - usage
  uint64_t swap_total = 0;  // SwapTotal (bounded by memory.swap.max where set)
  uint64_t swap_free = 0;
  bool cgroup_limited = false;  // a cgroup limit (Windows: a job's) below MemTotal applies
};

// Where the balancer reads memory from: the system, or a model of it (the
// simulator, tests).
class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;
  virtual MemoryInfo read() = 0;
  // How long a reading may stand for the system (Note [Memory readings] in
  // csrc/balancer/budget_gate.h): the balancer reuses it that long, adjusted by
  // its own pool's commits. 0 (models of memory: tests, the simulator): read
  // every time.
  virtual int64_t max_age_ns() const { return 0; }
};

// A cgroup's usage counts its page cache, which the kernel reclaims before it
// runs out; like MemAvailable, the room left under a limit counts the inactive
// file cache (memory.stat inactive_file, v1 total_inactive_file) as available.
//
// On Linux (sysmem_linux.cpp) it reads <root>/proc/meminfo,
// <root>/proc/self/cgroup and the cgroup files under <root>/sys/fs/cgroup (v2:
// memory.max, memory.current, memory.swap.max, taking the tightest limit along
// the path to the root; v1: memory/memory.limit_in_bytes,
// memory.usage_in_bytes). Missing cgroup files mean no limit; a missing or
// unreadable meminfo throws pins::ResourceError naming the file.
// On Windows (sysmem_win.cpp, Note [Windows memory readings]) it asks the
// system (GlobalMemoryStatusEx) and the job object the process runs in, if
// any; `root` has no meaning there.
// Thread-safe: read() may be called from several threads at once.
class SystemMemoryProbe final : public MemoryProbe {
 public:
  // The balancer reads /proc and the cgroup files at most every `max_age_ns`.
  static constexpr int64_t kDefaultMaxAgeNs = 5'000'000;  // 5 ms
  explicit SystemMemoryProbe(std::string root = "/", int64_t max_age_ns = kDefaultMaxAgeNs);
  ~SystemMemoryProbe() override;
  MemoryInfo read() override;
  int64_t max_age_ns() const override { return max_age_ns_.load(std::memory_order_relaxed); }
  // PINS_CONF memory_max_age_us; 0 reads every time (a replay that must not
  // depend on timing: the demo).
  void set_max_age_ns(int64_t ns) { max_age_ns_.store(ns, std::memory_order_relaxed); }

 private:
  // What the system's side reads, and keeps between readings:
  // sysmem_linux.cpp or sysmem_win.cpp.
  class Source;
  std::unique_ptr<Source> source_;
  std::atomic<int64_t> max_age_ns_;
};

// DESIGN.md: max(ceiling_min*R, min(ceiling_max*R, R - ceiling_reserve,
// R + swap - ceiling_swap_reserve)), with saturating subtraction.
uint64_t pin_ceiling(const MemoryInfo& m, const Config& c);

}  // namespace pins
