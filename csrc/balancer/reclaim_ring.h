// The ring of linked pins that the balancer walks, a few slots a call, to drop
// the pins whose source died.
//
// Note [Dead source reclaim]
// A pin whose source died (SourceGuard::alive() false) serves nothing, but its
// memory stays pinned until someone looks. Every linked pin has a slot in a
// ring; each acquire() and relieve() checks the next kReclaimPerCall pins of
// the ring (a cursor, wrapping) and drops those whose source died, freeing
// them outside the balancer's lock: bounded work per call, and no boundary
// needed. The slots not yet checked this round stay contiguous after the
// cursor (a removal keeps them so, new pins join at the end), so no pin is
// passed over: one whose source died is dropped within about pins /
// (kReclaimPerCall - 1) later calls. Each eviction decision checks
// kReclaimPerDecision slots, each prompt or node boundary kReclaimPerBoundary;
// Balancer::sweep() checks every pin (the free_pins op: an explicit request
// for RAM).
#pragma once

#include <cstddef>
#include <vector>

#include "csrc/balancer/registry.h"

namespace pins {

class ReclaimRing {
 public:
  // Slots checked per acquire() and relieve(), per eviction decision, and per
  // prompt or node boundary (the pins::end_prompt and pins::end_node ops).
  // Constants: no call's work grows with the pins.
  static constexpr size_t kPerCall = 8;
  static constexpr size_t kPerDecision = 8;
  static constexpr size_t kPerBoundary = 256;

  // `p` joins the ring after the cursor: not checked yet this round.
  void add(Pin* p);
  // `p` leaves the ring; the unchecked slots stay contiguous after the cursor.
  void remove(Pin* p);
  // The next pin to check, at most `checks` of them, each at most once:
  // `drop(p)` returns true when it removed p from the ring (its slot then
  // holds the next unchecked pin), false to move past it.
  template <typename Drop>
  void step(size_t checks, Drop&& drop) {
    for (size_t n = 0, end = checks < ring_.size() ? checks : ring_.size(); n < end && !ring_.empty(); ++n) {
      if (next_ >= ring_.size()) next_ = 0;  // a new round
      if (!drop(ring_[next_])) ++next_;
    }
  }
  size_t size() const { return ring_.size(); }

 private:
  std::vector<Pin*> ring_;  // slots [next_, end) are not checked yet this round
  size_t next_ = 0;
};

}  // namespace pins
