// Note [Trace policy]: the recorder's cursors, departures and next-use
// predictions, computed by hand.
#include "csrc/balancer/trace.h"

#include <gtest/gtest.h>

#include <initializer_list>

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

}  // namespace
}  // namespace pins
