#include "csrc/balancer/reclaim_ring.h"

#include <cstdint>

#include "csrc/base/check.h"

namespace pins {

void ReclaimRing::add(Pin* p) {
  p->ring = ring_.size();
  ring_.push_back(p);
}

void ReclaimRing::remove(Pin* p) {
  size_t hole = p->ring;
  PINS_ASSERT(hole < ring_.size() && ring_[hole] == p);
  // Each move takes ring_[from] into the hole and leaves the hole at `from`.
  if (hole < next_) {
    // A checked slot: the last checked pin fills it, so the unchecked ones
    // stay contiguous after the cursor.
    const size_t from = --next_;
    ring_[hole] = ring_[from];
    ring_[hole]->ring = hole;
    hole = from;
  }
  if (const size_t last = ring_.size() - 1; hole != last) {
    ring_[hole] = ring_[last];
    ring_[hole]->ring = hole;
  }
  ring_.pop_back();
  p->ring = SIZE_MAX;
}

}  // namespace pins
