#include "csrc/balancer/trace.h"

#include <algorithm>

namespace pins {

void TraceRecorder::record(const TraceKey& k) {
  // A prompt longer than the limit (or a process that never ends one) keeps no
  // record, so memory stays bounded.
  if (now_.size() < kLimit) {
    now_first_.emplace(k, static_cast<uint32_t>(now_.size()));
    now_.push_back(k);
  } else if (!overflow_) {
    overflow_ = true;
    now_ = {};
    now_first_ = {};
  }
  if (departed_) return;
  bool following = false;
  for (Record& rec : records_) {
    if (rec.departed) continue;
    const size_t window = std::max<size_t>(64, rec.keys.size() / 50);
    bool found = false;
    if (auto it = rec.pos.find(k); it != rec.pos.end()) {
      auto pos = std::lower_bound(it->second.begin(), it->second.end(), static_cast<uint32_t>(rec.cursor));
      if (pos != it->second.end() && *pos - rec.cursor <= window) {
        rec.cursor = *pos + 1;
        found = true;
      }
    }
    // A patch set that changed (a LoRA swap) leaves the weights' order as it was.
    if (!found && k.kind != Kind::Patches) rec.departed = true;
    following |= !rec.departed;
  }
  if (!following) {
    departed_ = true;
    departures_++;
  }
}

void TraceRecorder::end_prompt() {
  if (overflow_) {
    overflow_ = false;
    now_ = {};
    now_first_ = {};
  } else if (!now_.empty()) {
    Record rec;
    rec.keys = std::move(now_);
    for (uint32_t i = 0; i < rec.keys.size(); ++i) rec.pos[rec.keys[i]].push_back(i);
    records_.push_front(std::move(rec));
    if (records_.size() > kRecords) records_.pop_back();
    now_.clear();
    now_first_.clear();
  }
  for (Record& rec : records_) {
    rec.cursor = 0;
    rec.departed = false;
  }
  departed_ = records_.empty();
}

uint64_t TraceRecorder::next_use(const TraceKey& k) const {
  uint64_t best = kNever;
  size_t active = records_.size();
  for (size_t i = 0; i < records_.size(); ++i) {
    const Record& rec = records_[i];
    if (rec.departed) continue;
    if (active == records_.size()) active = i;
    auto it = rec.pos.find(k);
    if (it == rec.pos.end()) continue;
    auto pos = std::lower_bound(it->second.begin(), it->second.end(), static_cast<uint32_t>(rec.cursor));
    if (pos != it->second.end()) best = std::min<uint64_t>(best, *pos - rec.cursor);
  }
  if (best != kNever || active == records_.size()) return best;
  // Not used again in this prompt: when the prompt that followed the active
  // record last time comes again (Note [Trace policy]).
  const Record& ref = records_[active];
  const uint64_t rest = ref.keys.size() - std::min(ref.cursor, ref.keys.size());
  uint64_t next_len = ref.keys.size();
  if (active == 0) {
    if (auto it = now_first_.find(k); it != now_first_.end()) return rest + it->second;
  } else {
    const Record& next = records_[active - 1];
    if (auto it = next.pos.find(k); it != next.pos.end()) return rest + it->second.front();
    next_len = next.keys.size();
  }
  if (auto it = ref.pos.find(k); it != ref.pos.end()) return rest + next_len + it->second.front();
  return kNever;
}

}  // namespace pins
