// Note [Reuse policy]: what the history learns, the predictions and their
// hedging, computed by hand; the eviction order it gives.
#include "csrc/balancer/reuse.h"

#include <gtest/gtest.h>

#include "csrc/balancer/eviction.h"

namespace pins {
namespace {

TraceKey w(uint64_t storage) { return TraceKey{0, Kind::Weights, PinKey{storage, 0, 1}}; }

// A pin as the balancer leaves it after an access at `now`.
Pin accessed(ReuseHistory& h, uint64_t storage, uint64_t now) {
  const ReuseHistory::Learned l = h.record(w(storage), now);
  Pin p;
  p.key = w(storage).key;
  p.last_use = now;
  p.reuse_loop = l.loop;
  p.reuse_gap = l.gap;
  return p;
}

TEST(ReuseHistory, LearnsTheLoopDistanceInsideAPrompt) {
  ReuseHistory h;
  EXPECT_EQ(h.record(w(1), 1).loop, 0u) << "a first use knows nothing";
  h.record(w(2), 2);
  h.record(w(3), 3);
  const Pin p = accessed(h, 1, 4);  // one step of a loop of three later
  EXPECT_EQ(p.reuse_loop, 3u);
  EXPECT_EQ(p.reuse_gap, 0u) << "no other prompt used it";
  EXPECT_EQ(h.next_use(p, 5, true, true), 7u) << "the loop goes on: next step";
  EXPECT_EQ(h.next_use(p, 8, true, true), 7u) << "within half a loop late it still counts";
  EXPECT_EQ(h.next_use(p, 5, true, false), 9u)
      << "its model stopped: back with the next prompt (one prompt: this one's 5 accesses so far)";
}

TEST(ReuseHistory, AcrossPromptsItPredictsTheGapAndHedgesWhenItFails) {
  ReuseHistory h;
  // Prompt 0: keys 1..10 once each (10 accesses), prompt 1 likewise, prompt 2 not 1.
  for (uint64_t t = 1; t <= 10; ++t) h.record(w(t), t);
  h.end_prompt(10);
  for (uint64_t t = 11; t <= 20; ++t) h.record(w(t - 10), t);
  h.end_prompt(20);
  Pin p;
  p.key = w(1).key;
  p.last_use = 11;
  p.reuse_gap = h.record(w(1), 11).gap;  // what the balancer stored at that access
  EXPECT_EQ(p.reuse_gap, 1u) << "used in prompts 0 and 1";
  EXPECT_EQ(h.next_use(p, 21, true, true), 21u) << "back one prompt (10 accesses) later";
  EXPECT_EQ(h.next_use(p, 26, true, true), 21u) << "a prediction holds until half a prompt past it";
  EXPECT_EQ(h.next_use(p, 27, true, true), 31u) << "then two prompts";
  EXPECT_EQ(h.next_use(p, 37, true, true), 51u) << "then four";
  EXPECT_EQ(h.next_use(p, 57, true, true), ReuseHistory::kNever) << "then never";
}

TEST(ReuseHistory, TwoWorkflowsAlternatingLearnAGapOfTwo) {
  ReuseHistory h;
  uint64_t t = 0;
  for (int prompt = 0; prompt < 3; ++prompt) {
    const uint64_t base = prompt % 2 == 0 ? 100 : 200;  // A B A
    for (uint64_t k = 0; k < 5; ++k) h.record(w(base + k), ++t);
    h.end_prompt(t);
  }
  EXPECT_EQ(h.record(w(200), ++t).gap, 2u) << "B ran in prompts 1 and 3";
  EXPECT_EQ(h.prompt(), 3u);
}

TEST(ReuseHistory, AModelOutsideThePromptIsNotExpectedBeforeItEnds) {
  ReuseHistory h;
  for (uint64_t t = 1; t <= 10; ++t) h.record(w(t), t);
  h.end_prompt(10);
  Pin r;  // key 3, used once at 3: expected one prompt later, at 13
  r.key = w(3).key;
  r.last_use = 3;
  EXPECT_EQ(h.next_use(r, 15, true, false), 13u);
  EXPECT_EQ(h.next_use(r, 15, false, false), 20u) << "the prompt started at 10 and lasts 10 accesses";
  accessed(h, 1, 11);
  for (uint64_t t = 12; t <= 13; ++t) h.record(w(t), t);
  const Pin q = accessed(h, 1, 14);  // a loop of 3, and used in the last prompt
  EXPECT_EQ(h.next_use(q, 15, true, true), 17u) << "its model runs: the next step";
  EXPECT_EQ(h.next_use(q, 15, true, false), 24u) << "its model stopped: the next prompt";
}

TEST(ReuseHistory, ForgetsEverythingPastItsLimit) {
  ReuseHistory h;
  for (uint64_t k = 0; k < ReuseHistory::kLimit; ++k) h.record(w(k), k + 1);
  EXPECT_EQ(h.keys(), ReuseHistory::kLimit);
  h.record(w(ReuseHistory::kLimit), ReuseHistory::kLimit + 1);
  EXPECT_EQ(h.keys(), 1u) << "memory stays bounded";
}

// Eviction: farthest predicted next use first over tiers 1-4 (never first,
// larger first on a tie), active streaming pins last.
TEST(ReuseHistory, EvictionTakesTheFarthestPredictedUseFirst) {
  Models models;
  const auto add = [&](ModelId id, bool in_prompt, bool active) -> Model& {
    auto m = std::make_unique<Model>();
    m->id = id;
    m->in_prompt = in_prompt;
    m->active = active;
    Model& ref = *m;
    models.emplace(id, std::move(m));
    return ref;
  };
  uint64_t created = 0;
  const auto pin = [&](Model& m, uint64_t storage, uint64_t last, uint64_t loop, uint64_t gap, size_t bytes = 1) {
    auto p = std::make_unique<Pin>();
    p->key = PinKey{storage, 0, bytes};
    p->subset = Subset::Weights;
    p->model = m.id;
    p->bytes = bytes;
    p->created = ++created;
    p->last_use = last;
    p->reuse_loop = loop;
    p->reuse_gap = gap;
    p->state = PinState::Live;
    m.by_created[0].emplace(p->created, p.get());
    m.pins[0].emplace(p->key, std::move(p));
  };
  ReuseHistory h;
  h.end_prompt(100);  // one prompt of 100 accesses ended at 100
  Model& in = add(0, true, false);
  Model& out = add(1, false, false);
  Model& act = add(2, true, true);
  pin(in, 1, 110, 10, 0);      // looped, but its model stopped: one prompt later, 210
  pin(in, 2, 112, 10, 0);      // 212
  pin(in, 3, 105, 0, 1);       // next prompt: 205
  pin(out, 4, 90, 0, 2);       // two prompts later: 290
  pin(in, 5, 10, 0, 0);        // one prompt later: 110, not past 110 + 50 yet
  pin(in, 6, 1, 0, 0);         // 101
  pin(out, 8, 1, 0, 0);        // outside the prompt: not before its end, 200
  pin(act, 7, 114, 10, 0);     // tier 5, last; its model runs: the next step, 124
  pin(act, 9, 113, 10, 0);     // 123: the most recently used of the loop first
  const std::vector<Candidate> order =
      eviction_order(models, Reach::All, PolicyKind::Reuse, TraceRecorder{}, ReuseView{&h, 115});
  std::vector<uint64_t> got;
  for (const Candidate& c : order) got.push_back(c.pin->key.storage);
  EXPECT_EQ(got, (std::vector<uint64_t>{4, 2, 1, 3, 8, 5, 6, 7, 9}));
  // Later, 6 and 8 missed every expected use: never, so first (newer first on a tie).
  const std::vector<Candidate> later =
      eviction_order(models, Reach::SpareActive, PolicyKind::Reuse, TraceRecorder{}, ReuseView{&h, 460});
  ASSERT_EQ(later.size(), 7u);
  EXPECT_EQ(later[0].pin->key.storage, 8u);
  EXPECT_EQ(later[1].pin->key.storage, 6u);
}

TEST(ReuseHistory, ClairvoyantAsksTheFuture) {
  ReuseHistory h;
  h.set_future([](const PinKey& k, uint64_t now) { return k.storage == 1 ? now + 5 : ReuseHistory::kNever; });
  Pin p;
  p.key = w(1).key;
  EXPECT_EQ(h.next_use(p, 10, true, true), 15u);
  p.key = w(2).key;
  EXPECT_EQ(h.next_use(p, 10, true, true), ReuseHistory::kNever);
}

}  // namespace
}  // namespace pins
