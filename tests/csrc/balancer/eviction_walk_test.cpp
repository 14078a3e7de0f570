// Note [Eviction walk]: the lazy walk over the per-model indexes yields exactly
// eviction_order(), the reference, on random registries, and stops when asked.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <utility>

#include "csrc/balancer/eviction.h"
#include "tests/csrc/balancer/registry_fixture.h"

namespace pins {
namespace {

using testing::Registry;

std::vector<std::pair<Pin*, int>> walked(const Registry& r, Reach reach, PolicyKind policy,
                                         const TraceRecorder& trace, const ReuseView& reuse = {}) {
  std::vector<std::pair<Pin*, int>> out;
  walk_eviction_order(r.models, reach, policy, trace, [&](const Candidate& c) {
    out.emplace_back(c.pin, c.tier);
    return true;
  }, reuse);
  return out;
}

std::vector<std::pair<Pin*, int>> reference(const Registry& r, Reach reach, PolicyKind policy,
                                            const TraceRecorder& trace, const ReuseView& reuse = {}) {
  std::vector<std::pair<Pin*, int>> out;
  for (const Candidate& c : eviction_order(r.models, reach, policy, trace, reuse)) out.emplace_back(c.pin, c.tier);
  return out;
}

TEST(EvictionWalk, SameOrderAsTheReferenceOnRandomRegistries) {
  std::mt19937_64 rng(12345);
  const TraceRecorder none;  // not following: trace orders as mru
  for (int round = 0; round < 200; ++round) {
    Registry r;
    const int models = 1 + static_cast<int>(rng() % 5);
    for (int id = 0; id < models; ++id) {
      Model& m = r.add(id, rng() % 2 == 0, rng() % 4 == 0);
      const int pins = static_cast<int>(rng() % 12);
      for (int k = 0; k < pins; ++k)
        r.pin(m, 1000 * id + k, static_cast<Subset>(rng() % kSubsets), 1 + rng() % 3, rng() % 6);  // ties in last_use
    }
    for (Reach reach : {Reach::SparePromptStreaming, Reach::SpareActive, Reach::All})
      for (PolicyKind policy : {PolicyKind::Mru, PolicyKind::Lru, PolicyKind::Trace})
        ASSERT_EQ(walked(r, reach, policy, none), reference(r, reach, policy, none))
            << "round " << round << " policy " << static_cast<int>(policy) << " reach " << last_tier(reach);
  }
}

// Note [Reuse policy]: the walk over the by_reuse indexes (gap groups cut into
// stages) is the reference order, for any clock and prompt length: pins at
// every stage, never expected ones, models in and out of the prompt, ties.
TEST(EvictionWalk, ReuseSameOrderAsTheReferenceOnRandomRegistries) {
  const uint64_t seed = std::random_device{}();
  std::printf("EvictionWalk.ReuseSameOrderAsTheReferenceOnRandomRegistries seed %llu\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const TraceRecorder none;
  for (int round = 0; round < 300; ++round) {
    Registry r;
    ReuseHistory h;
    const uint64_t len = 1 + rng() % 40;
    if (rng() % 4 != 0) h.end_prompt(len);  // else no prompt ended: the prompt so far is the length
    const int models = 1 + static_cast<int>(rng() % 4);
    for (int id = 0; id < models; ++id) {
      Model& m = r.add(id, rng() % 2 == 0, rng() % 4 == 0);
      const int pins = static_cast<int>(rng() % 14);
      for (int k = 0; k < pins; ++k)
        r.pin(m, 1000 * id + k, static_cast<Subset>(rng() % kSubsets), 1 + rng() % 3, rng() % (6 * len),
              rng() % 4);  // ties in last use, gaps 0-3
    }
    const uint64_t now = len + rng() % (8 * len);
    for (Reach reach : {Reach::SparePromptStreaming, Reach::SpareActive, Reach::All})
      ASSERT_EQ(walked(r, reach, PolicyKind::Reuse, none, {&h, now}),
                reference(r, reach, PolicyKind::Reuse, none, {&h, now}))
          << "seed " << seed << " round " << round << " reach " << last_tier(reach) << " now " << now;
  }
}

// Note [Trace index]: every pin into by_trace at its rank under `trace`.
void index_trace(Registry& r, const TraceRecorder& trace) {
  for (auto& [id, m] : r.models)
    for (int s = 0; s < kSubsets; ++s) {
      m->by_trace[s].clear();
      for (auto& [key, p] : m->pins[s]) trace_index(*m, p.get(), trace);
    }
}

TEST(EvictionWalk, TraceWhileFollowingWalksThePredictedOrder) {
  Registry r;
  Model& m = r.add(0, true, false);
  for (uint64_t k = 1; k <= 4; ++k) r.pin(m, k, Subset::Weights, 1, 0);
  TraceRecorder trace;
  for (uint64_t k : {1, 2, 3, 4}) trace.record({0, Kind::Weights, PinKey{k, 0, 1}});
  trace.end_prompt();
  trace.record({0, Kind::Weights, PinKey{1, 0, 1}});
  ASSERT_TRUE(trace.following());
  index_trace(r, trace);
  const auto order = walked(r, Reach::All, PolicyKind::Trace, trace);
  EXPECT_EQ(order, reference(r, Reach::All, PolicyKind::Trace, trace));
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0].first->key.storage, 1u) << "1 is next used by the next rerun: farthest";
  EXPECT_EQ(order[3].first->key.storage, 2u) << "2 comes next";
}

// Note [Trace index]: the walk over the by_trace indexes is the reference order
// for random registries and records followed to a random point: every class of
// rank (next in this prompt, in the next one, never), pins the records do not
// know, patches, ties in size, every tier and reach.
TEST(EvictionWalk, TraceSameOrderAsTheReferenceOnRandomRegistries) {
  const uint64_t seed = std::random_device{}();
  std::printf("EvictionWalk.TraceSameOrderAsTheReferenceOnRandomRegistries seed %llu\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int followed = 0;
  for (int round = 0; round < 300; ++round) {
    Registry r;
    std::vector<TraceKey> keys;  // the pins' accesses, and a few no pin serves
    const int models = 1 + static_cast<int>(rng() % 4);
    for (int id = 0; id < models; ++id) {
      Model& m = r.add(id, rng() % 2 == 0, rng() % 4 == 0);
      const int pins = static_cast<int>(rng() % 14);
      for (int k = 0; k < pins; ++k) {
        const auto s = static_cast<Subset>(rng() % kSubsets);
        const size_t bytes = 1 + rng() % 3;
        r.pin(m, 1000 * id + k, s, bytes, 0);
        keys.push_back({id, is_patch(s) ? Kind::Patches : Kind::Weights, PinKey{1000 * static_cast<uint64_t>(id) + k, 0, bytes}});
      }
      keys.push_back({id, Kind::Weights, PinKey{999999, 0, 1}});
    }
    TraceRecorder trace;
    std::vector<std::vector<TraceKey>> prompts;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int p = 0; p < n; ++p) {
      std::vector<TraceKey> prompt;
      const size_t len = 1 + rng() % 40;
      for (size_t i = 0; i < len; ++i) prompt.push_back(keys[rng() % keys.size()]);
      for (const TraceKey& k : prompt) trace.record(k);
      trace.end_prompt();
      prompts.push_back(prompt);
    }
    // The current prompt replays one of them up to a random point (an older one
    // makes the newer records depart: the active record is then not the first).
    const auto& replay = prompts[rng() % prompts.size()];
    const size_t upto = rng() % (replay.size() + 1);
    for (size_t i = 0; i < upto; ++i) trace.record(replay[i]);
    followed += trace.following();
    index_trace(r, trace);
    for (Reach reach : {Reach::SparePromptStreaming, Reach::SpareActive, Reach::All})
      ASSERT_EQ(walked(r, reach, PolicyKind::Trace, trace), reference(r, reach, PolicyKind::Trace, trace))
          << "seed " << seed << " round " << round << " reach " << last_tier(reach);
  }
  EXPECT_GT(followed, 200) << "most rounds must test the walk while a record is followed";
}

TEST(EvictionWalk, StopsWhenTheVisitorSaysSo) {
  Registry r;
  Model& m = r.add(0, false, false);
  for (uint64_t k = 1; k <= 10; ++k) r.pin(m, k, Subset::Weights, 1, k);
  int visited = 0;
  walk_eviction_order(r.models, Reach::All, PolicyKind::Mru, TraceRecorder{}, [&](const Candidate& c) {
    ++visited;
    EXPECT_EQ(c.pin->key.storage, 11u - visited);  // newest first
    return visited < 3;
  });
  EXPECT_EQ(visited, 3);
}

}  // namespace
}  // namespace pins
