// System memory as the balancer sees it: total RAM R, available RAM A, swap, and
// the cgroup limits that bound both. See DESIGN.md "Budget".
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "csrc/config/config.h"

namespace pins {

struct MemoryInfo {
  uint64_t total = 0;       // R: MemTotal, bounded by the cgroup limit
  uint64_t available = 0;   // A: MemAvailable, bounded by the cgroup's limit - usage
  uint64_t swap_total = 0;  // SwapTotal (bounded by memory.swap.max where set)
  uint64_t swap_free = 0;
  bool cgroup_limited = false;  // a cgroup limit below MemTotal applies
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
// Reads <root>/proc/meminfo, <root>/proc/self/cgroup and the cgroup files under
// <root>/sys/fs/cgroup (v2: memory.max, memory.current, memory.swap.max, taking
// the tightest limit along the path to the root; v1: memory/memory.limit_in_bytes,
// memory.usage_in_bytes). Missing cgroup files mean no limit; a missing or
// unreadable meminfo throws pins::ResourceError naming the file.
// Thread-safe: read() may be called from several threads at once.
class SystemMemoryProbe final : public MemoryProbe {
 public:
  // The balancer reads /proc and the cgroup files at most every `max_age_ns`.
  static constexpr int64_t kDefaultMaxAgeNs = 5'000'000;  // 5 ms
  explicit SystemMemoryProbe(std::string root = "/", int64_t max_age_ns = kDefaultMaxAgeNs);
  MemoryInfo read() override;
  int64_t max_age_ns() const override { return max_age_ns_.load(std::memory_order_relaxed); }
  // PINS_CONF memory_max_age_us; 0 reads every time (a replay that must not
  // depend on timing: the demo).
  void set_max_age_ns(int64_t ns) { max_age_ns_.store(ns, std::memory_order_relaxed); }

 private:
  // The files of one cgroup directory on the path from this process's cgroup to
  // the hierarchy root.
  struct CgroupDir {
    std::string limit;       // v2 memory.max, v1 memory.limit_in_bytes
    std::string usage;       // v2 memory.current, v1 memory.usage_in_bytes
    std::string swap_limit;  // v2 memory.swap.max; empty for v1
    std::string swap_usage;  // v2 memory.swap.current; empty for v1
    std::string stat;        // memory.stat: its inactive file cache is reclaimable
  };
  void resolve_cgroup();

  std::string root_;
  std::string meminfo_path_;
  std::atomic<int64_t> max_age_ns_;
  // Resolved from <root>/proc/self/cgroup on the first read() and kept: the
  // files are re-read every time, the directory list is not.
  std::once_flag resolved_;
  bool cgroup_v1_ = false;          // written once under resolved_
  std::vector<CgroupDir> cgroup_;   // leaf first; written once under resolved_
};

// DESIGN.md: max(ceiling_min*R, min(ceiling_max*R, R - ceiling_reserve,
// R + swap - ceiling_swap_reserve)), with saturating subtraction.
uint64_t pin_ceiling(const MemoryInfo& m, const Config& c);

}  // namespace pins
