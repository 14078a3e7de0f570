// The reuse policy's memory: in which prompts each source was used, the next
// use it predicts for a pin, and how that prediction is hedged when it fails.
//
// Note [Reuse policy]
// Under the reuse policy every acquire() tells the history (model, kind, key)
// in prompt q (end_prompt() counts them). A key used before in an earlier
// prompt learns its prompt gap g (q - its last prompt: 1 for a rerun, 2 for
// two workflows alternating); the gap survives the pin (a key evicted and used
// again keeps it), so the history is longer than one prompt and needs no
// assumption about the pattern. A pin is predicted back at the same point of a
// later prompt: next = last + c L, where L is the length in accesses of the
// last prompt (of this one so far before any ended) and c = max(g, 1) at first.
// A prediction that passes by max(g, 1) L / 2 without the use is hedged: c
// doubles, twice (the workflow may run less often than it did), then the pin
// is never expected (it stopped coming back). A pin of a model the current
// prompt does not use is not expected before the prompt ends: its order key is
// max(next, the prompt's start + L).
// Eviction takes the largest key first (never first; then the larger
// prediction, the larger pin, the newer pin) over tiers 1-4 as the reach
// allows, active streaming pins (tier 5) last. So it keeps what comes back
// soonest, whatever model it belongs to, and what stopped coming back goes
// first. Inside a node the active model's streaming pins are tier 5, kept as
// under every policy.
// Among pins of one stage, never expected ones included, ties go to the later
// last use, then the larger pin, then the newer one.
// The cost: pins of one model and subset with the same max(g, 1) keep their
// order by last use whatever L and now, and their stages are ranges of it
// (the older the use, the later the stage: cut points failed_before()), so
// each (g, stage) is a range of one ordered index (Model::by_reuse) and a
// decision merges the heads of those ranges (few: gaps are small numbers)
// instead of sorting every pin; nothing is recomputed at a boundary.
// History entries: at most kLimit (2^18 sources, about 25 MiB at most; a
// workflow's weights are thousands), the whole history forgotten when passed;
// `reuse_keys` in the stats counts them.
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
  static constexpr size_t kLimit = size_t{1} << 18;
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  static constexpr int kStages = 3;  // c = max(g, 1) x 1, 2, 4, then never

  // An access to `k`; returns its prompt gap (0: seen in this prompt only).
  uint64_t record(const TraceKey& k);
  // The prompt boundary at clock `now`.
  void end_prompt(uint64_t now);

  // p's predicted next use (clock) seen at `now`, from its last use and gap;
  // kNever once every stage failed. Saturates.
  uint64_t prediction(const Pin& p, uint64_t now) const;
  // The order key: the prediction, not before the prompt's expected end for a
  // model the prompt does not use (`in_prompt` false). The clairvoyant variant
  // returns the true next use.
  uint64_t order_key(const Pin& p, bool in_prompt, uint64_t now) const;
  // A pin of gap `gap` used before this clock has failed stage `stage` by
  // `now` (its deadline, last + c L + max(g, 1) L / 2, passed): the walk's cut
  // points within a group of Model::by_reuse.
  uint64_t failed_before(uint64_t gap, int stage, uint64_t now) const;
  // p's entry in Model::by_reuse: (max(g, 1), last use, bytes, created).
  static Model::ReuseKey index_key(const Pin& p) {
    return {p.reuse_gap > 0 ? p.reuse_gap : 1, p.last_use, p.bytes, p.created};
  }

  // The simulator's clairvoyant variant (profiling/sim, policy "clairvoyant"):
  // order_key() is `future` (the key's next use after the clock now, kNever
  // when none) and eviction sorts by it. Not for production: it knows the future.
  using Future = std::function<uint64_t(const PinKey&, uint64_t now)>;
  void set_future(Future future) { future_ = std::move(future); }
  bool clairvoyant() const { return static_cast<bool>(future_); }

  uint64_t prompt() const { return prompt_; }
  size_t keys() const { return keys_.size(); }
  // One prompt's length in accesses: the last one's, or this one's so far before any ended.
  uint64_t prompt_len(uint64_t now) const;

 private:
  struct Entry {
    uint64_t last_prompt = 0;
    uint64_t gap = 0;  // prompts between its last two prompts; 0: seen in one prompt only
  };
  std::unordered_map<TraceKey, Entry, TraceKeyHash> keys_;
  uint64_t prompt_ = 0;        // prompts ended
  uint64_t prompt_start_ = 0;  // clock at the last boundary
  uint64_t prompt_len_ = 0;    // accesses of the last prompt; 0: none ended
  Future future_;
};

}  // namespace pins
