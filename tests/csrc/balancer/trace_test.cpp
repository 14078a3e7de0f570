// Note [Trace policy]: the recorder's cursors, departures and next-use
// predictions, computed by hand.
#include "csrc/balancer/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <tuple>
#include <vector>

namespace pins {
namespace {

TraceKey w(uint64_t storage) { return TraceKey{0, Kind::Weights, PinKey{storage, 0, 1}}; }
TraceKey patch(uint64_t storage) { return TraceKey{0, Kind::Patches, PinKey{storage, 0, 1}}; }

void prompt(TraceRecorder& t, std::initializer_list<uint64_t> keys) {
  for (uint64_t k : keys) t.record(w(k));
  t.end_prompt();
}

TEST(TraceRecorder, NothingToFollowBeforeTheFirstRecord) {
  TraceRecorder t;
  EXPECT_FALSE(t.following());
  t.record(w(1));
  EXPECT_FALSE(t.following());
  EXPECT_EQ(t.departures(), 0) << "no record: nothing to depart from";
  t.end_prompt();
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.records(), 1u);
}

TEST(TraceRecorder, RerunPredictsFromTheRecordThenFromItsOwnStart) {
  TraceRecorder t;
  prompt(t, {1, 2, 3});
  t.record(w(1));  // cursor 1
  EXPECT_EQ(t.next_use(w(2)), 0u);
  EXPECT_EQ(t.next_use(w(3)), 1u);
  // 1 is behind the cursor: next used by the next rerun, after the rest (2) of this one.
  EXPECT_EQ(t.next_use(w(1)), 2u);
  EXPECT_EQ(t.next_use(w(9)), TraceRecorder::kNever);
}

// A seed change runs the sampler (2, 3) without the encoder (1), whose output
// comes from the application's cache: its rerun predicts the encoder where the
// older full prompt had it, one prompt later (the next text change), not never.
TEST(TraceRecorder, ARerunPredictsWhatOnlyAnOlderRecordUsedAfterTheNextPrompt) {
  TraceRecorder t;
  prompt(t, {1, 2, 3});
  prompt(t, {2, 3});
  t.record(w(2));  // the seed change again: cursor 1
  EXPECT_EQ(t.next_use(w(3)), 0u);
  EXPECT_EQ(t.next_use(w(2)), 1u);
  EXPECT_EQ(t.next_use(w(1)), 3u) << "after the rest (1) and the next rerun (2)";
  EXPECT_EQ(t.next_use(w(9)), TraceRecorder::kNever);
}

TEST(TraceRecorder, AlternatingPromptsPredictTheOtherWorkflow) {
  TraceRecorder t;
  prompt(t, {1, 2});  // A
  prompt(t, {3, 4});  // B
  t.record(w(1));     // A again: departs from B's record, follows A's
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.next_use(w(2)), 0u);
  // B followed A last time: the rest of A (1) plus the position in B.
  EXPECT_EQ(t.next_use(w(3)), 1u);
  EXPECT_EQ(t.next_use(w(4)), 2u);
  // Only A's past used 1: one prompt later still, after all of B (2).
  EXPECT_EQ(t.next_use(w(1)), 3u);
}

// Three workflows in turn: after A come B and C, as the last time A ran, and
// then A again.
TEST(TraceRecorder, WorkflowsInTurnPredictTheCycle) {
  TraceRecorder t;
  prompt(t, {1, 2});     // A
  prompt(t, {3, 4, 5});  // B
  prompt(t, {6, 7});     // C
  t.record(w(1));        // A again: follows A's record, the oldest
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.next_use(w(2)), 0u);
  // The rest of A (1), then B at its positions.
  EXPECT_EQ(t.next_use(w(3)), 1u);
  EXPECT_EQ(t.next_use(w(5)), 3u);
  // Then C, after all of B (3): not "never", as when only the next prompt counted.
  EXPECT_EQ(t.next_use(w(6)), 4u);
  EXPECT_EQ(t.next_use(w(7)), 5u);
  // A's own key comes round after B and C (3 + 2).
  EXPECT_EQ(t.next_use(w(1)), 6u);
  EXPECT_EQ(t.next_use(w(9)), TraceRecorder::kNever);
  const TraceRecorder::Rank c = t.rank(w(6)), a = t.rank(w(1)), b = t.rank(w(3));
  EXPECT_EQ(c.cls, 1u);
  EXPECT_LT(std::tie(b.cls, b.value), std::tie(c.cls, c.value));
  EXPECT_LT(std::tie(c.cls, c.value), std::tie(a.cls, a.value));
}

TEST(TraceRecorder, DepartsOnAnUnknownWeightButSkipsUnknownPatches) {
  TraceRecorder t;
  prompt(t, {1, 2, 3});
  t.record(w(1));
  t.record(patch(50));  // a LoRA swap: another patch set
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.departures(), 0);
  t.record(w(7));
  EXPECT_FALSE(t.following());
  EXPECT_EQ(t.departures(), 1);
  t.record(w(8));
  EXPECT_EQ(t.departures(), 1) << "one departure per prompt";
  t.end_prompt();
  EXPECT_TRUE(t.following()) << "the boundary rewinds every record";
}

TEST(TraceRecorder, AccessesBeyondTheWindowDepart) {
  TraceRecorder t;
  for (uint64_t k = 0; k < 100; ++k) t.record(w(k));
  t.end_prompt();
  t.record(w(64));  // 64 ahead of cursor 0: within the window of 64
  EXPECT_TRUE(t.following());
  t.end_prompt();   // the record of this prompt, [64], becomes the most recent
  t.record(w(99));  // too far ahead in the 100-key record, absent from [64]
  EXPECT_FALSE(t.following());
}

TEST(TraceRecorder, KeepsTheLastRecordsOnly) {
  TraceRecorder t;
  for (uint64_t p = 0; p < TraceRecorder::kRecords + 3; ++p) prompt(t, {p});
  EXPECT_EQ(t.records(), TraceRecorder::kRecords);
  TraceRecorder empty;
  empty.end_prompt();
  EXPECT_EQ(empty.records(), 0u) << "an empty prompt leaves no record";
}

TEST(TraceRecorder, DepartIsForTheRestOfThePrompt) {
  TraceRecorder t;
  prompt(t, {1, 2});
  t.depart();
  EXPECT_FALSE(t.following());
  EXPECT_EQ(t.departures(), 0) << "a change of policy is not counted as a departure";
  t.end_prompt();
  EXPECT_TRUE(t.following());
}

// Note [Trace index]: next_use() is the rank read against the active record,
// farther exactly when the rank is larger.
TEST(TraceRecorder, RankOrdersAsNextUse) {
  TraceRecorder t;
  prompt(t, {1, 2, 3, 4});
  prompt(t, {5, 1, 2, 6});
  t.record(w(5));
  t.record(w(1));  // follows the last record [5 1 2 6], cursor 2
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6, 9};
  for (uint64_t a : keys)
    for (uint64_t b : keys) {
      const TraceRecorder::Rank ra = t.rank(w(a)), rb = t.rank(w(b));
      EXPECT_EQ(t.next_use(w(a)) < t.next_use(w(b)), std::tie(ra.cls, ra.value) < std::tie(rb.cls, rb.value))
          << a << " against " << b;
    }
  EXPECT_EQ(t.rank(w(2)).cls, 0u) << "next in this prompt";
  EXPECT_EQ(t.rank(w(5)).cls, 1u) << "next in the next rerun";
  EXPECT_EQ(t.rank(w(9)).cls, 2u) << "never";
}

// Note [Cached conditioning]: an encoder (model 1) runs once, then a sampler
// (model 2) loops three times, then a VAE (model 3) runs once.
TraceKey of(ModelId m, uint64_t storage) { return TraceKey{m, Kind::Weights, PinKey{storage, 0, 1}}; }

void workflow(TraceRecorder& t, int sampler_passes, bool encode_after = false) {
  t.record(of(1, 10));
  t.record(of(1, 11));
  for (int i = 0; i < sampler_passes; ++i) {
    t.record(of(2, 20));
    t.record(of(2, 21));
  }
  if (encode_after) t.record(of(1, 10));
  t.record(of(3, 30));
}

TEST(TraceRecorder, ARerunPredictsItsConditioningAfterTheNextPrompt) {
  TraceRecorder t;
  workflow(t, 3);
  t.end_prompt();
  workflow(t, 3);  // follows the record to its end
  ASSERT_TRUE(t.following());
  EXPECT_TRUE(t.conditioning(1));
  EXPECT_FALSE(t.conditioning(2)) << "the sampler";
  EXPECT_FALSE(t.conditioning(3)) << "the VAE runs after the loop";
  // Record length 9: the sampler and the VAE are next used in the next prompt
  // (at 2 and 8), the encoder in the one after it (9 + 0).
  EXPECT_EQ(t.next_use(of(2, 20)), 2u);
  EXPECT_EQ(t.next_use(of(3, 30)), 8u);
  EXPECT_EQ(t.next_use(of(1, 10)), 9u);
  EXPECT_EQ(t.next_use(of(1, 11)), 10u);
  EXPECT_GT(t.next_use(of(1, 10)), t.next_use(of(3, 30)));
}

TEST(TraceRecorder, NoConditioningBeforeTheLoopNorForAModelThatRunsAfterIt) {
  TraceRecorder t;
  workflow(t, 3);
  t.end_prompt();
  // Two passes (an encoder's positive and negative prompt) are not a loop yet.
  t.record(of(1, 10));
  t.record(of(1, 11));
  for (int i = 0; i < 2; ++i) {
    t.record(of(2, 20));
    t.record(of(2, 21));
  }
  EXPECT_FALSE(t.conditioning(1));
  EXPECT_EQ(t.next_use(of(1, 10)), 3u) << "the rest of the record (3), then first in the next prompt";
  const uint64_t gen = t.generation();
  t.record(of(2, 20));  // the third pass: the loop
  ASSERT_TRUE(t.following());
  EXPECT_TRUE(t.conditioning(1));
  EXPECT_GT(t.generation(), gen) << "the conditioning set moved every rank of its models";
  // The encoder runs again after the sampler: it is not conditioning.
  t.record(of(1, 10));
  EXPECT_FALSE(t.conditioning(1));
  t.end_prompt();
  EXPECT_FALSE(t.conditioning(1)) << "a new prompt starts with none";
}

TEST(TraceRecorder, OnlyARerunPredictionDefersTheConditioning) {
  TraceRecorder t;
  workflow(t, 3);    // A
  t.end_prompt();
  prompt(t, {7, 8});  // B, model 0
  workflow(t, 3);    // A again: follows A's record, the older one
  EXPECT_TRUE(t.conditioning(1));
  // B followed A last time and A comes after it: the encoder's next use is
  // the rest of A (0), B (2) and its position in A (0), as without the rule.
  EXPECT_EQ(t.next_use(of(1, 10)), 2u);
}

// One prompt: the encoder (model 1) once, then `sampler`'s layer three times
// (a loop), or once (`loops` false: it stayed on the device).
void encode_and_sample(TraceRecorder& t, ModelId sampler, bool loops = true) {
  t.record(of(1, 100));
  for (int i = 0; i < (loops ? 3 : 1); ++i) t.record(of(sampler, 10 * sampler));
  t.end_prompt();
}

// Note [Trace marks]: workflows a (sampler 2) and b (sampler 5) share the
// encoder. After a b, an a prompt follows both records through the encoder,
// and b's, the most recent, predicts b's sampler in this prompt. Marks naming
// a's sampler depart b's record, as the prompt starts or as the sampler loads
// after the encoder ran; a mark of the encoder alone departs nothing.
TEST(TraceRecorder, MarksNamingASamplerDepartTheRecordsOfOtherWorkflows) {
  for (const int marked_at : {0, 1, -1}) {  // accesses recorded before the sampler's mark; -1: none
    SCOPED_TRACE(marked_at);
    TraceRecorder t;
    encode_and_sample(t, 2);
    encode_and_sample(t, 5);
    t.mark({1});
    if (marked_at == 0) t.mark({2});
    t.record(of(1, 100));
    if (marked_at == 1) t.mark({2});
    ASSERT_TRUE(t.following());
    if (marked_at < 0) {
      EXPECT_LT(t.next_use(of(5, 50)), t.next_use(of(2, 20))) << "b's record: b's sampler in this prompt";
    } else {
      EXPECT_LT(t.next_use(of(2, 20)), t.next_use(of(5, 50))) << "a's record: a's sampler now, b's next prompt";
    }
  }
}

// Note [First-seen models]: the streaks say whether the user's workflows go
// on past their first prompt. A seed change whose models stayed on the device
// (a large GPU) accesses nothing and leaves no record; its marks say it ran
// workflow a (encoder 1, sampler 2) again, so a, then a prompt of a with no
// access, then b's first prompt is a streak that went on. Marks naming another
// workflow, or none, say nothing of it.
TEST(TraceRecorder, APromptThatMarkedItsWorkflowAndAccessedNothingContinuesItsStreak) {
  for (const int marks : {2, 7, -1}) {  // the empty prompt's mark; -1: none
    SCOPED_TRACE(marks);
    TraceRecorder t;
    encode_and_sample(t, 2);
    if (marks >= 0) t.mark({marks});
    t.end_prompt();
    EXPECT_EQ(t.records(), 1u) << "an empty prompt leaves no record";
    encode_and_sample(t, 5);
    EXPECT_EQ(t.streaks_go_on(), marks == 2);
  }
}

// Note [Trace policy]: a one-off leaves the cycle where streaks go on. After
// a a b (b new) the user returns to a: the active record is a's first, and
// what came after it last time was a again and then b. Where a went on (a a
// b a), b ran once as a detour and is not predicted again: its sampler is
// never used. Where the workflows took turns (a b a) or b ran twice (a a b b
// a), the cycle comes round to b. The encoder, which a and b share, is next
// used at the next prompt's start either way.
TEST(TraceRecorder, WhereStreaksGoOnAOneOffIsNotPredictedToComeRound) {
  for (const int shape : {0, 1, 2}) {  // 0: a a b a; 1: a b a; 2: a a b b a
    SCOPED_TRACE(shape);
    TraceRecorder t;
    encode_and_sample(t, 2);
    if (shape != 1) encode_and_sample(t, 2);
    encode_and_sample(t, 5);
    if (shape == 2) encode_and_sample(t, 5);
    t.record(of(1, 100));
    t.record(of(2, 20));  // a again: b's records depart
    ASSERT_TRUE(t.following());
    EXPECT_EQ(t.streaks_go_on(), shape != 1) << "a a b, a a b b: streaks went on; a b: a switched";
    if (shape == 0) {
      EXPECT_EQ(t.next_use(of(5, 50)), TraceRecorder::kNever) << "b ran once, a detour";
    } else {
      EXPECT_NE(t.next_use(of(5, 50)), TraceRecorder::kNever) << "the cycle comes round to b";
    }
    // The rest of this prompt (a's sampler twice), then the encoder, which b
    // and a share, at the next prompt's start.
    EXPECT_EQ(t.next_use(of(1, 100)), 2u);
  }
}

// Note [Trace memory]: a streak of a longer than the kept records leaves no
// record that came first in its streak, and still counts as going on; so does
// a streak the records hold whole (a a a b). With one a before the bs (a b b
// b), a switched at once and b's streak is only as long as the records show.
TEST(TraceRecorder, AStreakLongerThanTheKeptRecordsStillGoesOn) {
  for (const size_t streak : {TraceRecorder::kRecords + 2, size_t{3}}) {
    SCOPED_TRACE(streak);
    TraceRecorder t;
    for (size_t i = 0; i < streak; ++i) encode_and_sample(t, 2);
    EXPECT_TRUE(t.streaks_go_on());
    encode_and_sample(t, 5);  // a new workflow after the streak
    EXPECT_TRUE(t.streaks_go_on());
  }
  TraceRecorder t;
  encode_and_sample(t, 2);
  encode_and_sample(t, 5);
  EXPECT_FALSE(t.streaks_go_on()) << "a b: a switched after one prompt";
}

// Note [Trace memory]: eight records, so five workflows in turn (samplers 2-6,
// one encoder) are seen whole: when the first comes round again its record is
// still kept and followed, and the cycle predicts the second next. With four
// records the first one's sampler departed every record.
TEST(TraceRecorder, KeepsEightRecords) {
  EXPECT_EQ(TraceRecorder::kRecords, 8u);
  TraceRecorder t;
  for (ModelId sampler = 2; sampler <= 6; ++sampler) encode_and_sample(t, sampler);
  EXPECT_EQ(t.records(), 5u);
  t.record(of(1, 100));
  t.record(of(2, 20));
  EXPECT_TRUE(t.following()) << "the first workflow's record is kept";
  EXPECT_NE(t.next_use(of(3, 30)), TraceRecorder::kNever) << "the second workflow comes next";
}

// Note [Trace memory]: a record with the same accesses as a newer one moves
// with it. A recorder whose records of a are twins (a b a) predicts and reports
// exactly what one predicts where the older a differs only in a patch at its
// end (followed on its own): at each access, the ranks, the keys reported moved
// and whether it still follows, up to the access that departs both.
TEST(TraceRecorder, RecordsWithTheSameAccessesMoveTogether) {
  const std::vector<TraceKey> a = {w(1), w(2), w(3), w(2), w(3), w(2), w(3)}, b = {w(4), w(5)};
  std::vector<TraceKey> a_patched = a;
  a_patched.push_back(patch(9));
  TraceRecorder twins, apart;
  const auto run = [](TraceRecorder& t, const std::vector<std::vector<TraceKey>>& prompts) {
    for (const std::vector<TraceKey>& p : prompts) {
      for (const TraceKey& k : p) t.record(k);
      t.end_prompt();
    }
  };
  run(twins, {a, b, a});
  run(apart, {a_patched, b, a});
  const std::vector<TraceKey> all = {w(1), w(2), w(3), w(4), w(5)};
  for (const TraceKey& k : {w(1), w(2), w(3), w(2), w(4)}) {
    std::vector<TraceKey> moved_twins, moved_apart;
    twins.record(k, &moved_twins);
    apart.record(k, &moved_apart);
    ASSERT_EQ(twins.following(), apart.following());
    EXPECT_EQ(moved_twins, moved_apart);
    if (!twins.following()) break;
    for (const TraceKey& u : all) EXPECT_EQ(twins.next_use(u), apart.next_use(u)) << u.key.storage;
  }
  EXPECT_FALSE(twins.following()) << "b's key departs both records of a";
}

// Note [Trace memory]: bytes() counts each record's accesses and keys and the
// current prompt's, and what the recorder drops leaves the count.
TEST(TraceRecorder, BytesCountTheRecordsAndTheCurrentPrompt) {
  TraceRecorder t;
  EXPECT_LT(t.bytes(), 1024u) << "nothing recorded";
  constexpr size_t kTensors = 1000, kSteps = 20, kAccesses = kTensors * kSteps;
  const auto streaming_prompt = [&] {
    for (size_t s = 0; s < kSteps; ++s)
      for (uint64_t k = 0; k < kTensors; ++k) t.record(w(k));
  };
  streaming_prompt();
  const size_t current = t.bytes();
  EXPECT_GE(current, kAccesses * sizeof(TraceKey)) << "the current prompt's accesses";
  t.end_prompt();
  const size_t one = t.bytes();
  std::printf("a prompt of %zu tensors for %zu steps: %zu bytes a record\n", kTensors, kSteps, one);
  EXPECT_GE(one, kAccesses * (sizeof(TraceKey) + sizeof(uint32_t)) + kTensors * sizeof(TraceKey));
  EXPECT_LE(one, kAccesses * 64 + kTensors * 256) << "about 40 bytes an access, a hundred more a key";
  for (size_t p = 1; p < TraceRecorder::kRecords + 3; ++p) {
    streaming_prompt();
    t.end_prompt();
  }
  EXPECT_EQ(t.records(), TraceRecorder::kRecords);
  EXPECT_LE(t.bytes(), TraceRecorder::kRecords * one + one / 2) << "the records dropped left the count";
  EXPECT_GE(t.bytes(), TraceRecorder::kRecords * (one - one / 4));
}

// Note [Trace marks] before the prompt's first access: a seed change of a
// workflow (encoder 1, sampler 2) marks its sampler and not the encoder, whose
// output comes from the application's cache. At the prompt's start the record
// of the full prompt predicts the encoder first; the marks say it does not run
// in this prompt, so its next use is the next prompt's. Marks that name the
// encoder too, or come only after the first access (a model marked as it
// loads), leave the record's order.
TEST(TraceRecorder, MarksBeforeTheFirstAccessSayTheUnmarkedEncoderDoesNotRun) {
  {
    TraceRecorder t;
    encode_and_sample(t, 2);
    t.mark({2});
    EXPECT_EQ(t.rank(of(1, 100)).cls, 1u) << "the encoder does not run in this prompt";
    EXPECT_GT(t.next_use(of(1, 100)), t.next_use(of(2, 20)));
    const uint64_t gen = t.generation();
    t.mark({1});  // marked after all (as it loads): it runs in this prompt
    EXPECT_EQ(t.next_use(of(1, 100)), 0u);
    EXPECT_GT(t.generation(), gen) << "its rank moved: a new generation (Note [Trace index])";
  }
  {
    TraceRecorder t;
    encode_and_sample(t, 2);
    t.mark({1, 2});
    EXPECT_EQ(t.next_use(of(1, 100)), 0u) << "marked: the encoder runs first, as recorded";
  }
  // Marked only after the first access: the record's order, as with no mark.
  TraceRecorder t, unmarked;
  for (TraceRecorder* r : {&t, &unmarked}) {
    encode_and_sample(*r, 2);
    r->record(of(2, 20));
  }
  t.mark({2});
  EXPECT_EQ(t.next_use(of(1, 100)), unmarked.next_use(of(1, 100)));
}

// A record with no loop (its models stayed on the device) names no sampler.
// After b (a loop over sampler 5) and c (the encoder and model 6, once each):
// ComfyUI's mark of the encoder as it loads departs nothing, so b's record is
// still followed when b's sampler comes; marks that name b's sampler depart c
// only when they name none of its models.
TEST(TraceRecorder, MarksDepartARecordWithNoLoopOnlyWhenTheyNameNoneOfItsModels) {
  const auto b_then_c = [](TraceRecorder& t) {
    encode_and_sample(t, 5);
    encode_and_sample(t, 6, /*loops=*/false);
  };
  {
    TraceRecorder t;
    b_then_c(t);
    t.mark({1});
    t.record(of(1, 100));
    t.record(of(5, 50));  // departs c's record by its keys
    EXPECT_TRUE(t.following()) << "the encoder's mark left b's record followed";
  }
  {
    TraceRecorder t;
    b_then_c(t);
    t.mark({1, 5});
    EXPECT_LT(t.next_use(of(6, 60)), t.next_use(of(5, 50))) << "c ran the marked encoder: it stays, the most recent";
  }
  {
    TraceRecorder t;
    b_then_c(t);
    t.mark({5});  // a seed change of b: c ran none of the marked models
    EXPECT_LT(t.next_use(of(5, 50)), t.next_use(of(6, 60))) << "c departed: b's record is active";
  }
}

// Note [Trace index]: within one generation, a key whose rank an access changes
// is among the keys record() reports as moved; a change of the active record
// changes the generation. Random prompts over a few keys: reruns, prefixes,
// departures, LoRA patches that come and go.
TEST(TraceRecorder, RecordReportsEveryKeyWhoseRankMoved) {
  const uint64_t seed = std::random_device{}();
  std::printf("TraceRecorder.RecordReportsEveryKeyWhoseRankMoved seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<TraceKey> universe;
  // Keys of three models, so that some prompts have conditioning models (Note
  // [Cached conditioning]).
  for (uint64_t k = 1; k <= 12; ++k) universe.push_back(TraceKey{static_cast<ModelId>(k % 3), Kind::Weights, w(k).key});
  for (uint64_t k = 1; k <= 4; ++k) universe.push_back(TraceKey{static_cast<ModelId>(k % 3), Kind::Patches, patch(100 + k).key});
  TraceRecorder t;
  std::vector<std::vector<TraceKey>> past;
  std::vector<TraceKey> moved;
  for (int p = 0; p < 60; ++p) {
    // The next prompt: a past one (often with a change or two), else a fresh draw.
    std::vector<TraceKey> next;
    if (!past.empty() && rng() % 4 != 0) {
      next = past[rng() % past.size()];
      if (rng() % 2 == 0 && !next.empty()) next[rng() % next.size()] = universe[rng() % universe.size()];
      if (rng() % 3 == 0) next.resize(rng() % (next.size() + 1));
    } else {
      const size_t len = 1 + rng() % 30;
      for (size_t i = 0; i < len; ++i) next.push_back(universe[rng() % universe.size()]);
    }
    for (const TraceKey& k : next) {
      const auto ranks = [&] {
        std::vector<TraceRecorder::Rank> out;
        for (const TraceKey& u : universe) out.push_back(t.following() ? t.rank(u) : TraceRecorder::Rank{});
        return out;
      };
      std::vector<TraceRecorder::Rank> before = ranks();
      bool following = t.following();
      uint64_t gen = t.generation();
      if (rng() % 4 == 0) {
        // Note [Trace marks]: a mark that departs records changes the
        // generation or no rank.
        t.mark({static_cast<ModelId>(rng() % 3)});
        if (following && t.following() && t.generation() == gen)
          for (size_t i = 0; i < universe.size(); ++i) {
            const TraceRecorder::Rank r = t.rank(universe[i]);
            ASSERT_TRUE(r.cls == before[i].cls && r.value == before[i].value)
                << "seed " << seed << " prompt " << p << ": key " << universe[i].key.storage
                << " moved by a mark in the same generation";
          }
        before = ranks();
        following = t.following();
        gen = t.generation();
      }
      moved.clear();
      t.record(k, &moved);
      if (!following || !t.following() || t.generation() != gen) continue;
      for (size_t i = 0; i < universe.size(); ++i) {
        const TraceRecorder::Rank r = t.rank(universe[i]);
        if (r.cls == before[i].cls && r.value == before[i].value) continue;
        ASSERT_NE(std::find(moved.begin(), moved.end(), universe[i]), moved.end())
            << "seed " << seed << " prompt " << p << ": key " << universe[i].key.storage
            << " moved without being reported";
      }
    }
    past.push_back(next);
    t.end_prompt();
  }
}

}  // namespace
}  // namespace pins
