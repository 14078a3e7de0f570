#include "csrc/balancer/reuse.h"

#include <algorithm>

#include "csrc/base/saturate.h"

namespace pins {

uint64_t ReuseHistory::record(const TraceKey& k) {
  if (keys_.size() >= kLimit && !keys_.count(k)) keys_.clear();
  auto [it, fresh] = keys_.try_emplace(k);
  Entry& e = it->second;
  if (!fresh && e.last_prompt != prompt_) e.gap = prompt_ - e.last_prompt;
  e.last_prompt = prompt_;
  return e.gap;
}

void ReuseHistory::end_prompt(uint64_t now) {
  if (now == prompt_start_) return;  // an empty prompt changes nothing
  prompt_len_ = now - prompt_start_;
  prompt_start_ = now;
  prompt_++;
}

uint64_t ReuseHistory::prompt_len(uint64_t now) const {
  return std::max<uint64_t>(prompt_len_ > 0 ? prompt_len_ : now - prompt_start_, 1);
}

uint64_t ReuseHistory::failed_before(uint64_t gap, int stage, uint64_t now) const {
  const uint64_t g = std::max<uint64_t>(gap, 1), len = prompt_len(now);
  const uint64_t late = add_sat(mul_sat(g << stage, len), mul_sat(g, len) / 2);  // c L + g L / 2
  return now > late ? now - late : 0;
}

uint64_t ReuseHistory::prediction(const Pin& p, uint64_t now) const {
  // The first stage whose deadline has not passed: last + c L, c = g, 2g, 4g.
  for (int stage = 0; stage < kStages; ++stage)
    if (p.last_use >= failed_before(p.reuse_gap, stage, now))
      return add_sat(p.last_use, mul_sat(std::max<uint64_t>(p.reuse_gap, 1) << stage, prompt_len(now)));
  return kNever;
}

uint64_t ReuseHistory::order_key(const Pin& p, bool in_prompt, uint64_t now) const {
  if (future_) return future_(p.key, now);
  const uint64_t next = prediction(p, now);
  if (in_prompt || next == kNever) return next;
  return std::max(next, add_sat(prompt_start_, prompt_len(now)));
}

}  // namespace pins
