// DESIGN.md "Choosing and creating a pin", step 3: the one rule for where a new
// pin goes, used by the balancer and the simulator.
#include "csrc/balancer/registry.h"

#include <gtest/gtest.h>

namespace pins {
namespace {

TEST(TargetSubset, ResidentWeightsGoToTheCacheWhenAllowed) {
  EXPECT_EQ(target_subset(Kind::Weights, true, false, true), Subset::WeightsLoaded);
  EXPECT_EQ(target_subset(Kind::Weights, true, true, true), Subset::WeightsLoaded) << "a weight needs no signature";
  EXPECT_EQ(target_subset(Kind::Weights, false, false, true), Subset::Weights) << "streamed";
  EXPECT_EQ(target_subset(Kind::Weights, true, false, false), Subset::Weights) << "fast_disk or lru";
}

TEST(TargetSubset, ResidentPatchesNeedASignature) {
  EXPECT_EQ(target_subset(Kind::Patches, true, true, true), Subset::PatchesLoaded);
  EXPECT_EQ(target_subset(Kind::Patches, true, false, true), Subset::Patches) << "no signature";
  EXPECT_EQ(target_subset(Kind::Patches, false, true, true), Subset::Patches) << "streamed";
  EXPECT_EQ(target_subset(Kind::Patches, true, true, false), Subset::Patches) << "fast_disk or lru";
}

}  // namespace
}  // namespace pins
