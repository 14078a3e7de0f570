// Note [Pin eviction tiers] on a registry built by hand: tiers, reach, and the
// mru, lru and trace orders.
#include "csrc/balancer/eviction.h"

#include <gtest/gtest.h>

#include "tests/csrc/balancer/registry_fixture.h"

namespace pins {
namespace {

using testing::Registry;

std::vector<uint64_t> storages(const std::vector<Candidate>& order) {
  std::vector<uint64_t> out;
  for (const Candidate& c : order) out.push_back(c.pin->key.storage);
  return out;
}

TEST(EvictionTiers, TierOfFollowsPromptAndActivity) {
  Registry r;
  Model& out = r.add(0);
  Model& in = r.add(1, true);
  Model& act = r.add(2, false, true);  // active counts as in the prompt
  EXPECT_EQ(tier_of(*r.pin(out, 1, Subset::Weights), out), 1);
  EXPECT_EQ(tier_of(*r.pin(out, 2, Subset::Patches), out), 1);
  EXPECT_EQ(tier_of(*r.pin(out, 3, Subset::WeightsLoaded), out), 2);
  EXPECT_EQ(tier_of(*r.pin(out, 4, Subset::PatchesLoaded), out), 2);
  EXPECT_EQ(tier_of(*r.pin(in, 5, Subset::WeightsLoaded), in), 3);
  EXPECT_EQ(tier_of(*r.pin(act, 6, Subset::WeightsLoaded), act), 3);
  EXPECT_EQ(tier_of(*r.pin(in, 7, Subset::Weights), in), 4);
  EXPECT_EQ(tier_of(*r.pin(act, 8, Subset::Patches), act), 5);
}

TEST(EvictionOrder, MruWalksTiersThenNewestModelThenNewestPin) {
  Registry r;
  Model& old_out = r.add(0);
  Model& new_out = r.add(1);
  Model& in = r.add(2, true);
  Model& act = r.add(3, true, true);
  r.pin(old_out, 10, Subset::Weights);        // tier 1, older model
  r.pin(new_out, 11, Subset::Weights);        // tier 1, newer model
  r.pin(new_out, 12, Subset::Weights);        // tier 1, newer model, newer pin
  r.pin(old_out, 20, Subset::WeightsLoaded);  // tier 2
  r.pin(in, 30, Subset::WeightsLoaded);       // tier 3
  r.pin(in, 40, Subset::Weights);             // tier 4
  r.pin(act, 50, Subset::Weights);            // tier 5
  const TraceRecorder none;
  EXPECT_EQ(storages(eviction_order(r.models, Reach::All, PolicyKind::Mru, none)),
            (std::vector<uint64_t>{12, 11, 10, 20, 30, 40, 50}));
  EXPECT_EQ(storages(eviction_order(r.models, Reach::SpareActive, PolicyKind::Mru, none)),
            (std::vector<uint64_t>{12, 11, 10, 20, 30, 40}));
  EXPECT_EQ(storages(eviction_order(r.models, Reach::SparePromptStreaming, PolicyKind::Mru, none)),
            (std::vector<uint64_t>{12, 11, 10, 20, 30}));
  const auto order = eviction_order(r.models, Reach::All, PolicyKind::Mru, none);
  std::vector<int> tiers;
  for (const Candidate& c : order) tiers.push_back(c.tier);
  EXPECT_EQ(tiers, (std::vector<int>{1, 1, 1, 2, 3, 4, 5}));
}

TEST(EvictionOrder, LruWalksTiersThenOldestModelThenLeastRecentlyUsed) {
  Registry r;
  Model& a = r.add(0);
  Model& b = r.add(1);
  r.pin(b, 20, Subset::Weights, 1, 5);
  r.pin(a, 10, Subset::Weights, 1, 9);  // a is the older model: first whatever its use
  r.pin(a, 11, Subset::Weights, 1, 3);
  r.pin(b, 21, Subset::Weights, 1, 1);
  r.pin(a, 12, Subset::WeightsLoaded, 1, 0);  // tier 2 after every tier-1 pin
  const TraceRecorder none;
  EXPECT_EQ(storages(eviction_order(r.models, Reach::SpareActive, PolicyKind::Lru, none)),
            (std::vector<uint64_t>{11, 10, 21, 20, 12}));
}

// Note [Trace policy]: farthest predicted next use first across tiers 1-4,
// larger first on a tie, active streaming pins last; mru when not following.
TEST(EvictionOrder, TraceFarthestNextUseFirstWhileFollowing) {
  Registry r;
  Model& m = r.add(0, true);
  Model& act = r.add(1, true, true);
  const auto key = [](ModelId id, uint64_t s, size_t bytes = 1) { return TraceKey{id, Kind::Weights, PinKey{s, 0, bytes}}; };
  TraceRecorder trace;
  for (uint64_t s : {1, 2, 3, 4}) trace.record(key(0, s));
  trace.record(key(1, 9));
  trace.end_prompt();
  ASSERT_TRUE(trace.following());
  trace.record(key(0, 1));  // the next prompt follows the record: 2, 3, 4 come next, in that order
  r.pin(m, 2, Subset::Weights);
  r.pin(m, 4, Subset::WeightsLoaded);
  r.pin(m, 3, Subset::Weights);
  r.pin(m, 7, Subset::Weights, 1);  // no record knows 7 or 8: never used again
  r.pin(m, 8, Subset::Weights, 2);  // larger first on the tie
  r.pin(act, 9, Subset::Weights);   // tier 5 stays last
  EXPECT_EQ(storages(eviction_order(r.models, Reach::All, PolicyKind::Trace, trace)),
            (std::vector<uint64_t>{8, 7, 4, 3, 2, 9}));
  EXPECT_EQ(storages(eviction_order(r.models, Reach::SpareActive, PolicyKind::Trace, trace)),
            (std::vector<uint64_t>{8, 7, 4, 3, 2}));
  trace.depart();
  EXPECT_EQ(storages(eviction_order(r.models, Reach::SpareActive, PolicyKind::Trace, trace)),
            storages(eviction_order(r.models, Reach::SpareActive, PolicyKind::Mru, trace)))
      << "a departed prompt falls back to mru";
}

}  // namespace
}  // namespace pins
