// The reuse policy's memory: when each source was last used, how far apart its
// uses were inside a prompt and across prompts, and the next use it predicts.
//
// Note [Reuse policy]
// Under the reuse policy every acquire() tells the history (model, kind, key)
// at the balancer's clock t (one tick per access) in prompt q (end_prompt()
// counts them). A key used before in the same prompt learns its loop distance
// (t - its last use: one sampler step of a streamed model); a key used before
// in an earlier prompt learns its prompt gap (q - its last prompt: 1 for a
// rerun, 2 for two workflows alternating). Both survive the pin (a key evicted
// and used again keeps what it learned), so the history is longer than one
// prompt and needs no assumption about the pattern.
// A pin's predicted next use, as a function of the clock now, hedges when a
// prediction fails:
//   1. last + loop, while now <= last + 1.5 loop and the pin's model is active
//      (its loop goes on only while it runs: once the node ended, its pins
//      come back with the next prompt, not the next step; a key that never
//      looped skips this);
//   2. else last + D, last + 2D, last + 4D (D = gap x the last prompt's length
//      in accesses, gap 1 for a key seen in one prompt only), the first whose
//      deadline (the prediction + D/2) has not passed: the key comes back with
//      its workflow, or later when other prompts ran in between;
//   3. else never: it did not come back when expected three times.
// A pin of a model the current prompt does not use (tiers 1 and 2) is not
// predicted before the prompt's expected end (its start + the last length).
// Eviction takes the farthest predicted next use first (never first; larger,
// then newer, first on a tie) over tiers 1-4 as the reach allows, active
// streaming pins (tier 5) last. So inside a loop larger than memory it keeps a
// stable part, as mru does; across prompts it keeps what comes back soonest,
// whatever model it belongs to; and what stopped coming back goes first.
// History entries: at most kLimit, the whole history forgotten when passed.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <unordered_map>

#include "csrc/balancer/registry.h"
#include "csrc/balancer/trace.h"

namespace pins {

// Not thread-safe: the Balancer holds it under its mutex.
class ReuseHistory {
 public:
  static constexpr size_t kLimit = size_t{1} << 20;
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  // What a pin keeps of its key's history: the loop distance and the prompt gap.
  struct Learned {
    uint64_t loop = 0, gap = 0;
  };
  // An access to `k` at clock `now`; returns what the key learned so far.
  Learned record(const TraceKey& k, uint64_t now);
  // The prompt boundary at clock `now`.
  void end_prompt(uint64_t now);
  // The predicted clock of p's next use, seen at `now` (kNever: not expected);
  // `in_prompt`: p's model is in the current prompt (else not before it ends);
  // `running`: p's model is active, so its loop may go on.
  uint64_t next_use(const Pin& p, uint64_t now, bool in_prompt, bool running) const;

  // The simulator's clairvoyant variant (profiling/sim, policy "clairvoyant"):
  // next_use() asks `future` (the key's next use after the clock now, kNever
  // when none) instead of predicting. Not for production: it knows the future.
  using Future = std::function<uint64_t(const PinKey&, uint64_t now)>;
  void set_future(Future future) { future_ = std::move(future); }

  uint64_t prompt() const { return prompt_; }
  size_t keys() const { return keys_.size(); }

 private:
  uint64_t predict(const Pin& p, uint64_t now, bool running) const;  // steps 1-3 of the Note
  // One prompt's length in accesses: the last one's, or this one's so far before any ended.
  uint64_t prompt_len(uint64_t now) const;
  struct Entry {
    uint64_t last = 0;        // clock of the last use
    uint64_t last_prompt = 0;
    uint64_t loop = 0;        // distance between its last two uses in one prompt; 0: none seen
    uint64_t gap = 0;         // prompts between its last two prompts; 0: seen in one prompt only
  };
  std::unordered_map<TraceKey, Entry, TraceKeyHash> keys_;
  uint64_t prompt_ = 0;        // prompts ended
  uint64_t prompt_start_ = 0;  // clock at the last boundary
  uint64_t prompt_len_ = 0;    // accesses of the last prompt; 0: none ended
  Future future_;
};

}  // namespace pins
