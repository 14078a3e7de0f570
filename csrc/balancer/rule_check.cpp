#include "csrc/balancer/rule_check.h"

namespace pins {

bool RuleCheck::applies(ModelId m) const {
  const auto it = trust_.find(m);
  return (it != trust_.end() ? it->second : overall_) == 0;
}

void RuleCheck::judge(ModelId m, bool right) {
  (right ? right_ : wrong_)++;
  auto [it, fresh] = trust_.try_emplace(m, overall_);
  it->second = next(it->second, right);
  overall_ = next(overall_, right);
}

namespace {
bool meets(const std::unordered_set<ModelId>& a, const std::unordered_set<ModelId>& b) {
  const auto& small = a.size() <= b.size() ? a : b;
  const auto& large = a.size() <= b.size() ? b : a;
  for (ModelId m : small)
    if (large.count(m) != 0) return true;
  return false;
}
}  // namespace

void FirstSeenCheck::end_prompt(const std::unordered_set<ModelId>& ran, const std::unordered_set<ModelId>& looped) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    // The prompt it was noted in ran it: no verdict yet.
    if (p.prompts++ == 0) {
      ++it;
      continue;
    }
    if (ran.count(it->first) != 0) {
      check_.judge(it->first, /*right=*/false);  // it came back before the workflow it spared
    } else if (meets(looped, p.samplers)) {
      check_.judge(it->first, /*right=*/true);  // the spared workflow came back first
    } else if (p.prompts <= kPrompts) {
      ++it;
      continue;
    }
    it = pending_.erase(it);
  }
}

void FirstSeenCheck::forget(ModelId m) {
  pending_.erase(m);
  check_.forget(m);
  for (auto& [id, p] : pending_) {
    p.spared.erase(m);
    p.samplers.erase(m);
  }
}

void ConditioningCheck::end_prompt(const std::unordered_set<ModelId>& conditioning,
                                   const std::unordered_set<ModelId>& ran,
                                   const std::unordered_set<ModelId>& samplers) {
  const bool same_loop = meets(samplers, last_samplers_);
  for (ModelId m : last_) {
    if (ran.count(m) != 0) check_.judge(m, /*right=*/false);  // the encoder ran again: new text
    else if (same_loop) check_.judge(m, /*right=*/true);      // the same sampler, from the cache
  }
  last_ = conditioning;
  last_samplers_ = samplers;
}

}  // namespace pins
