#include "csrc/balancer/reuse.h"

#include <algorithm>

namespace pins {

ReuseHistory::Learned ReuseHistory::record(const TraceKey& k, uint64_t now) {
  if (keys_.size() >= kLimit && !keys_.count(k)) keys_.clear();
  auto [it, fresh] = keys_.try_emplace(k);
  Entry& e = it->second;
  if (!fresh) {
    if (e.last_prompt == prompt_) e.loop = now - e.last;
    else e.gap = prompt_ - e.last_prompt;
  }
  e.last = now;
  e.last_prompt = prompt_;
  return {e.loop, e.gap};
}

void ReuseHistory::end_prompt(uint64_t now) {
  if (now == prompt_start_) return;  // an empty prompt changes nothing
  prompt_len_ = now - prompt_start_;
  prompt_start_ = now;
  prompt_++;
}

uint64_t ReuseHistory::next_use(const Pin& p, uint64_t now, bool in_prompt, bool running) const {
  if (future_) return future_(p.key, now);
  const uint64_t next = predict(p, now, running);
  if (in_prompt || next == kNever) return next;
  // A model the prompt does not use: not before the prompt ends.
  return std::max(next, prompt_start_ + prompt_len(now));
}

uint64_t ReuseHistory::prompt_len(uint64_t now) const {
  return std::max<uint64_t>(prompt_len_ > 0 ? prompt_len_ : now - prompt_start_, 1);
}

uint64_t ReuseHistory::predict(const Pin& p, uint64_t now, bool running) const {
  const uint64_t last = p.last_use;
  if (running && p.reuse_loop > 0 && now <= last + p.reuse_loop + p.reuse_loop / 2) return last + p.reuse_loop;
  const uint64_t d = std::max<uint64_t>(p.reuse_gap, 1) * prompt_len(now);
  for (uint64_t next = last + d; next <= last + 4 * d; next += next - last)
    if (now <= next + d / 2) return next;
  return kNever;
}

}  // namespace pins
