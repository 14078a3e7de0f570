// Note [Reuse policy]: what the history learns, the predictions and their
// hedging, computed by hand, and the eviction order they give (the balancer's
// part: BalancerPolicy.Reuse* in balancer_test.cpp).
#include "csrc/balancer/reuse.h"

#include <gtest/gtest.h>

#include "csrc/balancer/eviction.h"

namespace pins {
namespace {

TraceKey w(uint64_t storage) { return TraceKey{0, Kind::Weights, PinKey{storage, 0, 1}}; }

Pin used(uint64_t storage, uint64_t last, uint64_t gap) {
  Pin p;
  p.key = w(storage).key;
  p.last_use = last;
  p.reuse_gap = gap;
  return p;
}

TEST(ReuseHistory, LearnsThePromptGap) {
  ReuseHistory h;
  EXPECT_EQ(h.record(w(1)), 0u) << "a first use knows nothing";
  EXPECT_EQ(h.record(w(1)), 0u) << "nor a second one in the same prompt";
  h.end_prompt(2);
  EXPECT_EQ(h.record(w(1)), 1u) << "a rerun";
  h.end_prompt(3);
  h.end_prompt(3);  // an empty prompt is no prompt
  h.record(w(2));
  h.end_prompt(4);
  EXPECT_EQ(h.record(w(1)), 2u) << "one prompt in between";
  EXPECT_EQ(h.prompt(), 3u);
}

TEST(ReuseHistory, PredictsTheSamePointOfALaterPromptAndHedges) {
  ReuseHistory h;
  h.end_prompt(10);  // one prompt of 10 accesses
  const Pin p = used(1, 11, 1);
  EXPECT_EQ(h.prediction(p, 12), 21u) << "back one prompt (10 accesses) later";
  EXPECT_EQ(h.prediction(p, 26), 21u) << "a prediction holds until half a prompt past it";
  EXPECT_EQ(h.prediction(p, 27), 31u) << "then two prompts";
  EXPECT_EQ(h.prediction(p, 37), 51u) << "then four";
  EXPECT_EQ(h.prediction(p, 56), 51u);
  EXPECT_EQ(h.prediction(p, 57), ReuseHistory::kNever) << "then never";
  const Pin q = used(2, 11, 2);  // two workflows alternating: two prompts, hedged by a prompt
  EXPECT_EQ(h.prediction(q, 12), 31u);
  EXPECT_EQ(h.prediction(q, 41), 31u);
  EXPECT_EQ(h.prediction(q, 42), 51u);
  EXPECT_EQ(h.failed_before(1, 0, 27), 12u) << "uses before 12 have failed stage 0 by 27: 27 - (10 + 5)";
  EXPECT_EQ(h.failed_before(1, 0, 5), 0u);
}

TEST(ReuseHistory, BeforeAnyPromptEndedThePromptSoFarIsTheLength) {
  ReuseHistory h;
  const Pin p = used(1, 4, 0);
  EXPECT_EQ(h.prediction(p, 6), 10u) << "6 accesses so far";
  EXPECT_EQ(h.prediction(p, 20), 24u);
}

TEST(ReuseHistory, AModelOutsideThePromptIsNotExpectedBeforeItEnds) {
  ReuseHistory h;
  h.end_prompt(10);
  const Pin r = used(3, 3, 0);  // used once at 3: expected at 13
  EXPECT_EQ(h.order_key(r, true, 15), 13u);
  EXPECT_EQ(h.order_key(r, false, 15), 20u) << "the prompt started at 10 and lasts 10 accesses";
  EXPECT_EQ(h.order_key(r, false, 200), ReuseHistory::kNever) << "never stays never";
}

TEST(ReuseHistory, ForgetsEverythingPastItsLimit) {
  ReuseHistory h;
  for (uint64_t k = 0; k < ReuseHistory::kLimit; ++k) h.record(w(k));
  EXPECT_EQ(h.keys(), ReuseHistory::kLimit);
  h.record(w(ReuseHistory::kLimit));
  EXPECT_EQ(h.keys(), 1u) << "memory stays bounded";
}

TEST(ReuseHistory, ClairvoyantAsksTheFuture) {
  ReuseHistory h;
  h.set_future([](const PinKey& k, uint64_t now) { return k.storage == 1 ? now + 5 : ReuseHistory::kNever; });
  EXPECT_TRUE(h.clairvoyant());
  EXPECT_EQ(h.order_key(used(1, 0, 0), false, 10), 15u);
  EXPECT_EQ(h.order_key(used(2, 0, 0), true, 10), ReuseHistory::kNever);
}

// Eviction: the largest order key first over tiers 1-4, never first, active
// streaming pins last.
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
  const auto pin = [&](Model& m, uint64_t storage, uint64_t last, uint64_t gap) {
    auto p = std::make_unique<Pin>();
    p->key = PinKey{storage, 0, 1};
    p->subset = Subset::Weights;
    p->model = m.id;
    p->bytes = 1;
    p->created = ++created;
    p->last_use = last;
    p->reuse_gap = gap;
    p->state = PinState::Live;
    m.by_created[0].emplace(p->created, p.get());
    m.by_reuse[0].emplace(ReuseHistory::index_key(*p), p.get());
    m.pins[0].emplace(p->key, std::move(p));
  };
  ReuseHistory h;
  h.end_prompt(100);  // one prompt of 100 accesses ended at 100
  Model& in = add(0, true, false);
  Model& out = add(1, false, false);
  Model& act = add(2, true, true);
  pin(in, 1, 110, 0);   // one prompt later: 210
  pin(in, 2, 112, 0);   // 212
  pin(in, 3, 105, 1);   // 205
  pin(out, 4, 90, 2);   // two prompts later: 290
  pin(in, 5, 10, 0);    // 110, not past 110 + 50 yet
  pin(in, 6, 1, 0);     // 101
  pin(out, 8, 1, 0);    // outside the prompt: not before its end, 200
  pin(act, 7, 114, 0);  // tier 5: last
  const ReuseView view{&h, 115};
  std::vector<uint64_t> got;
  for (const Candidate& c : eviction_order(models, Reach::All, PolicyKind::Reuse, TraceRecorder{}, view))
    got.push_back(c.pin->key.storage);
  EXPECT_EQ(got, (std::vector<uint64_t>{4, 2, 1, 3, 8, 5, 6, 7}));
  std::vector<uint64_t> walked;
  walk_eviction_order(models, Reach::All, PolicyKind::Reuse, TraceRecorder{}, [&](const Candidate& c) {
    walked.push_back(c.pin->key.storage);
    return true;
  }, view);
  EXPECT_EQ(walked, got) << "the indexes give the same order";
  // At 460, 6 and 8 missed every expected use: never, so first (later use,
  // then newer, first on a tie: 8 was made after 6).
  const std::vector<Candidate> later =
      eviction_order(models, Reach::SpareActive, PolicyKind::Reuse, TraceRecorder{}, ReuseView{&h, 460});
  ASSERT_EQ(later.size(), 7u);
  EXPECT_EQ(later[0].pin->key.storage, 8u);
  EXPECT_EQ(later[1].pin->key.storage, 6u);
}

}  // namespace
}  // namespace pins
