// Plain counters of the host pool. Levels are Stats (current, peak, and what was
// added and removed since the last reset); the rest are COUNTs or SUMs.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pins {

struct Stat {
  int64_t current = 0;    // level now
  int64_t peak = 0;       // highest level since reset_peak()
  int64_t allocated = 0;  // SUM added since reset_accumulated()
  int64_t freed = 0;      // SUM removed since reset_accumulated()

  void increase(int64_t n) {
    current += n;
    allocated += n;
    peak = std::max(peak, current);
  }
  void decrease(int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_accumulated() { allocated = freed = 0; }
  void reset_peak() { peak = current; }
};

struct PoolStats {
  Stat reserved_bytes;    // address space held in segments
  Stat committed_bytes;   // bytes backed by RAM
  Stat locked_bytes;      // bytes page-locked (registered with the driver, or mlocked), adopted blocks included
  Stat allocated_bytes;   // bytes in live blocks, aligned sizes
  Stat requested_bytes;   // bytes callers asked for, in live blocks
  Stat blocks;            // live blocks
  Stat copies;            // copies begun and not ended (Note [Copies from a block])
  Stat prewarmed_bytes;   // bytes committed ahead of need and not taken yet (HostPool::prewarm)
  // Note [Adopted blocks] (HostPool::adopt): blocks of memory mapped by a caller,
  // in no other level but locked_bytes and copies. Parked ones count until
  // released: `allocated` sums what was adopted, `freed` what was released.
  Stat adopted_bytes;     // bytes of adopted blocks not released yet
  Stat adopted_blocks;    // adopted blocks not released yet

  int64_t allocations = 0;     // COUNT successful allocations
  int64_t frees = 0;           // COUNT frees
  int64_t refusals = 0;        // COUNT allocations refused (cap or OS)
  int64_t deferred_frees = 0;  // COUNT frees delayed by a fence in flight
  int64_t segments = 0;        // COUNT segments reserved
  int64_t commits = 0;         // COUNT extents committed
  int64_t decommits = 0;       // COUNT extents decommitted
  int64_t registrations = 0;   // COUNT extents and adopted blocks page-locked
  int64_t unregistrations = 0; // COUNT extents and adopted blocks unlocked
  int64_t lock_failures = 0;   // COUNT page-lock calls the OS or driver refused
  int64_t busy_unlocks = 0;    // COUNT unlock() refused: a copy begun or a fence not done in the extent
  int64_t copy_refusals = 0;   // COUNT begin_copy() refused: the extent's page-lock was being dropped
  int64_t commit_ns = 0;       // SUM time spent committing
  int64_t lock_ns = 0;         // SUM time spent page-locking
  int64_t unlock_ns = 0;       // SUM time spent unlocking
  int64_t prewarms = 0;        // COUNT prewarm() calls that committed (not in `commits`)
  int64_t prewarm_ns = 0;      // SUM time prewarm() spent committing (not in `commit_ns`)
  int64_t prewarm_served = 0;  // COUNT extents cut from prewarmed memory for a request
  int64_t prewarm_served_bytes = 0;  // SUM bytes of those extents

  const char* backend = "";    // which backend serves the pool

  void reset_accumulated() {
    for (Stat* s : {&reserved_bytes, &committed_bytes, &locked_bytes, &allocated_bytes, &requested_bytes, &blocks,
                    &copies, &prewarmed_bytes, &adopted_bytes, &adopted_blocks})
      s->reset_accumulated();
    allocations = frees = refusals = deferred_frees = segments = commits = decommits = 0;
    registrations = unregistrations = lock_failures = busy_unlocks = copy_refusals = 0;
    commit_ns = lock_ns = unlock_ns = 0;
    prewarms = prewarm_ns = prewarm_served = prewarm_served_bytes = 0;
  }
  void reset_peak() {
    for (Stat* s : {&reserved_bytes, &committed_bytes, &locked_bytes, &allocated_bytes, &requested_bytes, &blocks,
                    &copies, &prewarmed_bytes, &adopted_bytes, &adopted_blocks})
      s->reset_peak();
  }
};

}  // namespace pins
