// Note [Rule checks]: each prediction rule's trust, and the verdicts the trace
// recorder gives the two rules from the prompts that ran.
#include "csrc/balancer/rule_check.h"

#include <gtest/gtest.h>

#include <utility>

#include "csrc/balancer/trace.h"

namespace pins {
namespace {

TEST(RuleCheck, AWrongVerdictStopsTheRuleUntilTwoRightOnes) {
  RuleCheck c;
  EXPECT_TRUE(c.applies(1)) << "no evidence yet: the rule applies";
  c.judge(1, /*right=*/false);
  EXPECT_FALSE(c.applies(1));
  EXPECT_FALSE(c.applies(2)) << "a model with no verdict of its own follows the overall trust";
  c.judge(1, true);
  EXPECT_FALSE(c.applies(1)) << "one right verdict is not enough";
  c.judge(1, true);
  EXPECT_TRUE(c.applies(1));
  EXPECT_TRUE(c.applies(2));
  c.judge(3, false);
  EXPECT_TRUE(c.applies(1)) << "1 keeps its own verdicts";
  EXPECT_FALSE(c.applies(4));
  c.forget(1);
  EXPECT_FALSE(c.applies(1)) << "forgotten: the overall trust again";
  EXPECT_EQ(c.wrong_verdicts(), 2);
  EXPECT_EQ(c.right_verdicts(), 2);
}

// Note [First-seen models]: a model noted when it first ran is judged by the
// later prompts: wrong when it runs again before the models it spared, right
// when they run first.
TEST(FirstSeenCheck, JudgesWhetherTheNewModelOrTheSparedWorkflowCameBackFirst) {
  FirstSeenCheck c;
  const auto spared = [] {
    return std::pair{std::unordered_set<ModelId>{1, 2}, std::unordered_set<ModelId>{2}};  // 2: the sampler
  };
  c.note(5, spared);
  c.end_prompt({5}, {5});  // the prompt it ran in: no verdict
  EXPECT_TRUE(c.noted(5));
  c.end_prompt({7, 1}, {7});  // neither: 1, an encoder of the spared workflow, ran beside another sampler
  EXPECT_TRUE(c.noted(5));
  c.end_prompt({5, 3}, {5});  // it came back first
  EXPECT_FALSE(c.noted(5));
  EXPECT_FALSE(c.applies(5));
  EXPECT_FALSE(c.applies(6)) << "the next new model follows the overall trust";
  c.note(6, spared);
  c.end_prompt({6}, {6});
  c.end_prompt({1, 2}, {2});  // the spared workflow came back first
  c.note(8, spared);
  c.end_prompt({8}, {8});
  c.end_prompt({2}, {2});
  EXPECT_TRUE(c.applies(9)) << "two right verdicts restore the rule";
  EXPECT_EQ(c.check().wrong_verdicts(), 1);
  EXPECT_EQ(c.check().right_verdicts(), 2);
  // A prediction no prompt decides is dropped after kPrompts prompts.
  c.note(10, spared);
  for (int i = 0; i <= FirstSeenCheck::kPrompts; ++i) c.end_prompt({11}, {11});
  EXPECT_FALSE(c.noted(10));
  EXPECT_EQ(c.check().wrong_verdicts() + c.check().right_verdicts(), 3);
}

TraceKey of(ModelId m, uint64_t storage) { return TraceKey{m, Kind::Weights, PinKey{storage, 0, 1}}; }

// An encoder `enc` (two layers), a sampler (model 2) that loops three times,
// a VAE (model 3); without the encoder for a seed change.
void run(TraceRecorder& t, ModelId enc, bool encode = true) {
  if (encode) {
    t.record(of(enc, 100 * enc));
    t.record(of(enc, 100 * enc + 1));
  }
  for (int i = 0; i < 3; ++i) {
    t.record(of(2, 20));
    t.record(of(2, 21));
  }
  t.record(of(3, 30));
}

// Note [Cached conditioning] checked: the text changes every prompt, so the
// encoder runs in each; the first rerun shows the rule wrong and it stops
// deferring the encoder, and a second encoder, never judged, follows.
TEST(TraceRecorderRuleChecks, ANewTextEveryPromptStopsDeferringTheEncoder) {
  TraceRecorder t;
  run(t, 1);
  t.end_prompt();
  run(t, 1);
  ASSERT_TRUE(t.conditioning(1));
  EXPECT_TRUE(t.defers_conditioning(1)) << "no evidence yet";
  const uint64_t before = t.next_use(of(1, 100));
  t.end_prompt();  // this prompt ran the encoder the last one deferred: wrong
  EXPECT_EQ(t.conditioning_check().check().wrong_verdicts(), 1);
  run(t, 1);
  ASSERT_TRUE(t.conditioning(1));
  EXPECT_FALSE(t.defers_conditioning(1));
  EXPECT_LT(t.next_use(of(1, 100)), before) << "the encoder is predicted in the next prompt again";
  t.end_prompt();
  run(t, 4);  // another encoder, the same sampler: 1 did not run, but it is not the rerun predicted
  t.end_prompt();
  run(t, 4);
  EXPECT_TRUE(t.conditioning(4));
  EXPECT_FALSE(t.defers_conditioning(4)) << "no verdict of its own: the overall trust";
}

// Where the rule holds (seed changes between text changes), every verdict is
// right and it keeps deferring the encoder.
TEST(TraceRecorderRuleChecks, SeedChangesKeepTheConditioningRule) {
  TraceRecorder t;
  for (int i = 0; i < 6; ++i) {
    run(t, 1, /*encode=*/i % 2 == 0);
    if (i % 2 == 0) EXPECT_TRUE(t.defers_conditioning(1)) << "prompt " << i;
    t.end_prompt();
  }
  EXPECT_EQ(t.conditioning_check().check().wrong_verdicts(), 0);
  EXPECT_EQ(t.conditioning_check().check().right_verdicts(), 3);
}


// Note [Trace context]: two encoders in pairs of prompts over one sampler (e1
// e1 e2 e2 ...). A first e1 prompt follows both e1 records; the most recent one
// came second in its pair and was followed by e2, the older one came after an
// e2 pair, as this prompt does, and was followed by e1 again. The choice
// predicts e1 next; when the next prompt runs e2 instead, its check stops it.
void pair_prompt(TraceRecorder& t, ModelId enc) {
  run(t, enc);
  t.end_prompt();
}

TEST(TraceRecorderRuleChecks, APromptAfterAPairFollowsTheRecordThatCameAfterOne) {
  TraceRecorder t;
  for (int i = 0; i < 8; ++i) pair_prompt(t, i % 4 < 2 ? 1 : 4);
  run(t, 1);  // the ninth: e1 after e2 e2
  EXPECT_LT(t.next_use(of(1, 100)), t.next_use(of(4, 400))) << "e1 again next, as after the last e2 pair";
  EXPECT_TRUE(t.context_check().applies(kAnyModel));
  t.end_prompt();
  pair_prompt(t, 4);  // but e2 came: the choice was wrong, the plain prediction right
  EXPECT_EQ(t.context_check().wrong_verdicts(), 1);
  EXPECT_FALSE(t.context_check().applies(kAnyModel));
}

// Note [Trace context] for a rerun: the second e1 of a pair follows the first
// one's record, which predicts e1 again; the older e1 record that came after
// an e1, as this prompt does, was followed by e2, which the records show
// twice. The choice predicts e2 next, and the next prompt judges it right.
TEST(TraceRecorderRuleChecks, TheSecondPromptOfAPairFollowsTheRecordThatCameSecond) {
  TraceRecorder t;
  for (int i = 0; i < 9; ++i) pair_prompt(t, i % 4 < 2 ? 1 : 4);
  run(t, 1);  // the tenth: the second e1 after e2 e2 e1
  ASSERT_TRUE(t.context_check().applies(kAnyModel));
  EXPECT_LT(t.next_use(of(4, 400)), t.next_use(of(1, 100))) << "e2 next, as after the last e1 pair";
  t.end_prompt();
  const int64_t right = t.context_check().right_verdicts();
  pair_prompt(t, 4);
  EXPECT_EQ(t.context_check().right_verdicts(), right + 1);
  EXPECT_EQ(t.context_check().wrong_verdicts(), 0);
}

// Note [Trace context] past a switch with no record of the same one: the
// first e1 after the first e2 pair (e1 e1 e2 e2 e1) follows both e1 records,
// and no kept record came after an e2. The most recent e1 record came second in
// its pair and was followed by e2; the older one came first in its streak, as
// this prompt does, and was followed by e1. The choice predicts e1 next, and
// the next prompt judges it right.
TEST(TraceRecorderRuleChecks, TheFirstPromptAfterASwitchFollowsTheRecordThatCameFirstInItsStreak) {
  TraceRecorder t;
  for (const ModelId enc : {1, 1, 4, 4}) pair_prompt(t, enc);
  run(t, 1);
  ASSERT_TRUE(t.context_check().applies(kAnyModel));
  EXPECT_LT(t.next_use(of(1, 100)), t.next_use(of(4, 400))) << "e1 again next, as after the first e1";
  t.end_prompt();
  pair_prompt(t, 1);
  EXPECT_EQ(t.context_check().right_verdicts(), 1);
  EXPECT_EQ(t.context_check().wrong_verdicts(), 0);
}

// A seed change takes the conditioning from the cache (Note [Cached
// conditioning]), so its prompt runs a part of its workflow's models: it
// continues the streak of that workflow. Workflow a (encoder 1, sampler 2) runs
// with new text and then with a new seed, b (encoder 4, sampler 5) twice, and a
// seed change of a follows both a records: the one that came first in a's
// streak predicts a again, the seed change's own successor b.
TEST(TraceRecorderRuleChecks, ASeedChangeContinuesTheStreakOfItsWorkflow) {
  TraceRecorder t;
  const auto prompt = [&](ModelId enc, ModelId sampler, bool encode) {
    if (encode) t.record(of(enc, 100 * enc));
    for (int i = 0; i < 3; ++i) t.record(of(sampler, 10 * sampler));
    t.record(of(3, 30));
  };
  for (const bool encode : {true, false}) {
    prompt(1, 2, encode);
    t.end_prompt();
  }
  for (int i = 0; i < 2; ++i) {
    prompt(4, 5, true);
    t.end_prompt();
  }
  prompt(1, 2, /*encode=*/false);
  ASSERT_TRUE(t.context_check().applies(kAnyModel));
  EXPECT_LT(t.next_use(of(2, 20)), t.next_use(of(5, 50))) << "a's sampler again next, as after a's first prompt";
}

// A workflow that ran once between reruns of another (e1 e1 e2 e1) is no
// pattern: the rerun after it predicts itself, not e2 again. (e2 only an
// older record used: after the next prompt, Note [Trace policy].)
TEST(TraceRecorderRuleChecks, ARerunAfterAOneOffDoesNotPredictTheOneOff) {
  TraceRecorder t;
  for (const ModelId enc : {1, 1, 4, 1}) pair_prompt(t, enc);
  run(t, 1);
  EXPECT_GT(t.next_use(of(4, 400)), t.next_use(of(3, 30))) << "after every key of the next prompt, the rerun";
  EXPECT_LT(t.next_use(of(1, 100)), t.next_use(of(3, 30)));
}

}  // namespace
}  // namespace pins
