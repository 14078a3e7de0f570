// Each prediction rule of the trace policy, checked against what happened.
//
// Note [Rule checks]
// The trace policy predicts from its records, and three rules predict past
// them: Note [First-seen models] (pin_table.h: a model no record knows is a
// one-off, so its loaded layers take no weight pin of the loop it interrupts),
// Note [Cached conditioning] (trace.h: the next rerun takes the encoders'
// output from the application's cache) and Note [Trace context] (trace.h: the
// record whose predecessor matches says what comes next). Each was learned
// from a pattern that is common but not universal: a workflow seen once is as
// often the user's next loop, and a prompt whose text changes runs its encoder
// again. So each rule keeps a check of its own. What a rule predicts is a
// model-level event at a prompt boundary (the interrupted workflow comes back
// before the new one; the encoder does not run in the next prompt; the next
// prompt runs the models the chosen record's successor ran), which the
// recorder sees whether the rule acted or not. So every time a rule's condition holds, the check
// notes the prediction (a shadow of it, kept also while the rule is off), and
// at the next prompt boundaries it judges it against the prompts that ran:
//   wrong  the data the rule refused or deferred was used again sooner than
//          predicted (the new model ran again before the workflow it spared;
//          the encoder ran in the next prompt);
//   right  what the rule spared was used first (the spared workflow came back
//          first; the next prompt of the same sampler ran without the encoder).
// A wrong verdict stops the rule for that model at once; it applies again after
// two right ones (trust -2, -1, 0: the rule applies at 0). A model with no
// verdict of its own (a model never seen before) follows the rule's overall
// trust, which every verdict moves the same way: a user who loops on every new
// workflow, or changes the text every prompt, has the rule off for the next
// new model too. (Before the first-seen rule's first verdict, the records'
// streaks decide instead: Note [First-seen models].) Judging costs O(models)
// at a prompt boundary and nothing per cast. (An ARC-style ghost list, the
// keys a rule refused with what mru would have read, would cost a lookup per
// cast and measure the cache rather than the prediction; the predictions here
// are about whole models, so the prompt's model set is the whole evidence.)
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "csrc/balancer/registry.h"

namespace pins {

// A rule about no model in particular is judged for this one (overall only).
inline constexpr ModelId kAnyModel = -1;

// One rule's trust, per model and overall. Not thread-safe: the Balancer holds
// it (through the TraceRecorder) under its mutex.
class RuleCheck {
 public:
  static constexpr int kWrong = -2;  // trust after a wrong verdict
  // Whether the rule applies to `m`: its own trust, else the overall one, is 0.
  bool applies(ModelId m) const;
  // A verdict on a prediction the rule made (or would have made) for `m`.
  void judge(ModelId m, bool right);
  void forget(ModelId m) { trust_.erase(m); }
  int64_t wrong_verdicts() const { return wrong_; }
  int64_t right_verdicts() const { return right_; }
  bool judged() const { return wrong_ + right_ > 0; }

 private:
  static int next(int trust, bool right) { return right ? (trust < 0 ? trust + 1 : 0) : kWrong; }
  std::unordered_map<ModelId, int> trust_;
  int overall_ = 0;
  int64_t wrong_ = 0;  // COUNT wrong verdicts
  int64_t right_ = 0;  // COUNT right verdicts
};

// Note [Rule checks] for Note [First-seen models]: each first-seen model whose
// loaded layers the rule spared the last prompt's workflow for, and that
// workflow's models, until a later prompt runs one of them.
class FirstSeenCheck {
 public:
  // The rule's condition held for a new cache pin of `m`, sparing `spared`
  // (the models of the user's loop the current prompt does not use; none: no
  // prediction). Noted once per model until judged.
  // `spared()` returns the models spared and the samplers of their workflow,
  // by which a later prompt is judged (encoders are shared across workflows).
  template <typename SparedFn>
  void note(ModelId m, SparedFn spared) {
    if (pending_.count(m) != 0) return;
    auto [models, samplers] = spared();
    if (!models.empty()) pending_.emplace(m, Pending{std::move(models), std::move(samplers), 0});  // empty: no prediction
  }
  bool noted(ModelId m) const { return pending_.count(m) != 0; }
  // The models the prediction noted for `m` spares; null when none is noted.
  const std::unordered_set<ModelId>* spared(ModelId m) const {
    const auto it = pending_.find(m);
    return it == pending_.end() ? nullptr : &it->second.spared;
  }
  // The prompt boundary: `ran` are the models of the prompt that ended,
  // `looped` its samplers. Judges each model noted in an earlier prompt: wrong
  // when it ran again before the workflow it spared, right when a sampler of
  // that workflow ran first; a prediction neither decides within kPrompts
  // prompts is dropped.
  void end_prompt(const std::unordered_set<ModelId>& ran, const std::unordered_set<ModelId>& looped);
  void forget(ModelId m);
  const RuleCheck& check() const { return check_; }
  bool applies(ModelId m) const { return check_.applies(m); }

  static constexpr int kPrompts = 4;

 private:
  struct Pending {
    std::unordered_set<ModelId> spared;
    std::unordered_set<ModelId> samplers;  // the spared workflow's
    int prompts = 0;  // prompt boundaries since it was noted
  };
  std::unordered_map<ModelId, Pending> pending_;
  RuleCheck check_;
};

// Note [Rule checks] for Note [Cached conditioning]: the conditioning models of
// the last prompt that looped, judged by the next prompt.
class ConditioningCheck {
 public:
  // The prompt boundary: `conditioning` the ending prompt's conditioning
  // models (empty when it did not loop), `ran` its models, `samplers` the
  // models that looped in it. Judges the previous prompt's: wrong for each that
  // ran again; right for each that did not, where a sampler of the previous
  // prompt looped in this one.
  void end_prompt(const std::unordered_set<ModelId>& conditioning, const std::unordered_set<ModelId>& ran,
                  const std::unordered_set<ModelId>& samplers);
  bool applies(ModelId m) const { return check_.applies(m); }
  void forget(ModelId m) {
    check_.forget(m);
    last_.erase(m);
  }
  const RuleCheck& check() const { return check_; }

 private:
  std::unordered_set<ModelId> last_;       // the previous prompt's conditioning models
  std::unordered_set<ModelId> last_samplers_;  // the models that looped in it
  RuleCheck check_;
};

}  // namespace pins
