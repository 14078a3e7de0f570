// DESIGN.md "Budget" against hand-computed values. The pin ceiling has its own
// tests in tests/csrc/system/sysmem_test.cpp.
#include "csrc/balancer/budget.h"

#include <gtest/gtest.h>

#include <limits>

namespace pins {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// Defaults: headroom 4 GiB, pin_reserve 2 GiB, pin_slack 256 MiB,
// relieve_slack 512 MiB, lock_hysteresis 2 GiB.
TEST(BudgetPin, ShortfallIsSizePlusReserveMinusAvailable) {
  const Config c;
  // reserve = max(4 GiB / 2, 2 GiB) = 2 GiB: a 1 GiB pin needs 3 GiB available.
  EXPECT_EQ(pin_shortfall(1 * GiB, 10 * GiB, c), 0u);
  EXPECT_EQ(pin_shortfall(1 * GiB, 3 * GiB, c), 0u) << "exactly enough is enough";
  EXPECT_EQ(pin_shortfall(1 * GiB, 3 * GiB - 1, c), 1u);
  EXPECT_EQ(pin_shortfall(1 * GiB, 2 * GiB + 512 * MiB, c), 512 * MiB);
  EXPECT_EQ(pin_shortfall(1 * GiB, 0, c), 3 * GiB);
}

TEST(BudgetPin, ReserveIsHalfTheHeadroomOrThePinReserve) {
  Config c;
  c.headroom = 10 * GiB;  // half of it, 5 GiB, beats the 2 GiB floor
  EXPECT_EQ(pin_shortfall(1 * GiB, 4 * GiB, c), 2 * GiB);
  c.headroom = 1 * GiB;  // half of it, 512 MiB, is under the floor
  EXPECT_EQ(pin_shortfall(1 * GiB, 1 * GiB, c), 2 * GiB);
  c.pin_reserve = 0;
  EXPECT_EQ(pin_shortfall(1 * GiB, 1 * GiB, c), 512 * MiB);
  c.headroom = 7;  // halved rounding down
  EXPECT_EQ(pin_shortfall(10, 0, c), 13u);
  c.headroom = 0;
  EXPECT_EQ(pin_shortfall(10, 0, c), 10u);
  EXPECT_EQ(pin_shortfall(10, 10, c), 0u);
}

TEST(BudgetPin, ShortfallSaturates) {
  const Config c;
  EXPECT_EQ(pin_shortfall(kMax, 0, c), kMax) << "a pin too large for any RAM never fits";
  EXPECT_EQ(pin_shortfall(kMax, kMax, c), 2 * GiB) << "bytes + reserve - A is 2 GiB, though bytes + reserve > 2^64";
}

// Note [Exact budget arithmetic]: near 2^64 every formula gives its exact value
// when that fits in 64 bits, saturates when it does not, and never wraps.
TEST(BudgetPin, ExactNearTwoToTheSixtyFour) {
  Config c;
  c.headroom = 0;
  c.pin_reserve = kMax;  // parse_config refuses this (Note [Configuration bounds]); the formula stays exact
  EXPECT_EQ(pin_shortfall(0, 0, c), kMax);
  EXPECT_EQ(pin_shortfall(1, 0, c), kMax) << "2^64 saturates";
  EXPECT_EQ(pin_shortfall(1, 1, c), kMax);
  EXPECT_EQ(pin_shortfall(1, 2, c), kMax - 1);
  EXPECT_EQ(pin_shortfall(kMax, kMax, c), kMax);
  EXPECT_EQ(pin_shortfall(0, kMax, c), 0u);
  c.pin_reserve = kMax - 10;
  EXPECT_EQ(pin_shortfall(20, 30, c), kMax - 20);
  EXPECT_EQ(pin_shortfall(20, kMax, c), 10u);
  EXPECT_EQ(pin_shortfall(kMax, kMax - 5, c), kMax - 5) << "bytes + reserve is past 2^64, the shortfall is not";
  c.pin_reserve = 100;
  EXPECT_EQ(pin_shortfall(kMax - 50, kMax, c), 50u);
  EXPECT_EQ(pin_shortfall(kMax - 100, kMax, c), 0u);
  EXPECT_EQ(pin_shortfall(kMax - 101, kMax, c), 0u);
  EXPECT_EQ(pin_shortfall(kMax, 0, c), kMax);
  c.headroom = kMax;  // reserve = headroom / 2 = 2^63 - 1
  c.pin_reserve = 0;
  EXPECT_EQ(pin_shortfall(uint64_t{1} << 63, 0, c), kMax);
  EXPECT_EQ(pin_shortfall(uint64_t{1} << 63, 1, c), kMax - 1);
  EXPECT_EQ(pin_free_goal(kMax - 1, c), kMax);
  EXPECT_EQ(relieve_shortfall(0, c), kMax);
  EXPECT_EQ(relieve_shortfall(kMax, c), 0u);
  EXPECT_EQ(relieve_free_goal(kMax, c), kMax);
  c.relieve_slack = kMax;
  EXPECT_EQ(relieve_free_goal(1, c), kMax);
}

TEST(BudgetPin, FreeGoalAddsThePinSlack) {
  Config c;
  EXPECT_EQ(pin_free_goal(0, c), 0u) << "no shortfall: nothing to free";
  EXPECT_EQ(pin_free_goal(1, c), 256 * MiB + 1);
  EXPECT_EQ(pin_free_goal(1 * GiB, c), 1 * GiB + 256 * MiB);
  EXPECT_EQ(pin_free_goal(kMax, c), kMax);
  c.pin_slack = 0;
  EXPECT_EQ(pin_free_goal(1 * GiB, c), 1 * GiB);
}

TEST(BudgetRelieve, ShortfallIsHeadroomMinusAvailable) {
  Config c;
  EXPECT_EQ(relieve_shortfall(5 * GiB, c), 0u);
  EXPECT_EQ(relieve_shortfall(4 * GiB, c), 0u) << "available at the headroom: no pressure";
  EXPECT_EQ(relieve_shortfall(4 * GiB - 1, c), 1u);
  EXPECT_EQ(relieve_shortfall(3 * GiB, c), 1 * GiB);
  EXPECT_EQ(relieve_shortfall(0, c), 4 * GiB);
  c.headroom = 0;
  EXPECT_EQ(relieve_shortfall(0, c), 0u) << "no headroom: never under pressure";
}

TEST(BudgetRelieve, FreeGoalAddsTheRelieveSlack) {
  Config c;
  EXPECT_EQ(relieve_free_goal(0, c), 0u);
  EXPECT_EQ(relieve_free_goal(1 * GiB, c), 1 * GiB + 512 * MiB);
  c.relieve_slack = 0;
  EXPECT_EQ(relieve_free_goal(1 * GiB, c), 1 * GiB);
}

TEST(BudgetLock, FitsUnderTheCeiling) {
  EXPECT_TRUE(lock_fits(6 * GiB, 2 * GiB, 8 * GiB)) << "up to the ceiling itself";
  EXPECT_FALSE(lock_fits(6 * GiB, 2 * GiB + 1, 8 * GiB));
  EXPECT_TRUE(lock_fits(0, 0, 0));
  EXPECT_FALSE(lock_fits(0, 1, 0));
  EXPECT_FALSE(lock_fits(kMax - 1, 2, kMax - 1)) << "saturates instead of wrapping";
  EXPECT_FALSE(lock_fits(kMax - 1, 2, kMax)) << "2^64 + 1 does not fit under 2^64 - 1";
  EXPECT_FALSE(lock_fits(kMax, 1, kMax));
  EXPECT_TRUE(lock_fits(kMax - 1, 1, kMax));
  EXPECT_TRUE(lock_fits(0, kMax, kMax));
  EXPECT_FALSE(lock_fits(1, kMax, kMax));
}

TEST(BudgetLock, DropGoalLeavesTheHysteresisAndThePin) {
  Config c;  // lock_hysteresis 2 GiB
  EXPECT_EQ(lock_drop_goal(20 * GiB, 1 * GiB, c), 17 * GiB);
  EXPECT_EQ(lock_drop_goal(3 * GiB + 1, 1 * GiB, c), 1u);
  EXPECT_EQ(lock_drop_goal(3 * GiB, 1 * GiB, c), 0u);
  EXPECT_EQ(lock_drop_goal(2 * GiB, 1 * GiB, c), 0u) << "below zero: drop every lock";
  EXPECT_EQ(lock_drop_goal(20 * GiB, kMax, c), 0u);
  EXPECT_EQ(lock_drop_goal(kMax, kMax, c), 0u);
  EXPECT_EQ(lock_drop_goal(kMax, kMax - 2 * GiB, c), 0u);
  EXPECT_EQ(lock_drop_goal(kMax, kMax - 2 * GiB - 1, c), 1u);
  EXPECT_EQ(lock_drop_goal(kMax, 0, c), kMax - 2 * GiB);
  c.lock_hysteresis = kMax;
  EXPECT_EQ(lock_drop_goal(kMax, 0, c), 0u);
  EXPECT_EQ(lock_drop_goal(kMax, 1, c), 0u) << "hysteresis + bytes is past 2^64: the exact goal is negative";
  c.lock_hysteresis = 0;
  EXPECT_EQ(lock_drop_goal(20 * GiB, 1 * GiB, c), 19 * GiB);
}

// Note [Pressure from others]: the headroom (or what the last relief left)
// less pins' own growth since, at most the slack down to the reserve line.
TEST(BudgetPressure, TheMonitorsLineDiscountsPinsOwnSlack) {
  const uint64_t h = 4 * GiB, line = 2 * GiB;
  EXPECT_EQ(pressure_line(0, kMax, h, line), h) << "no growth: the headroom";
  EXPECT_EQ(pressure_line(512 * MiB, kMax, h, line), h - 512 * MiB);
  EXPECT_EQ(pressure_line(2 * GiB, kMax, h, line), 2 * GiB) << "all of the slack: the reserve line";
  EXPECT_EQ(pressure_line(3 * GiB, kMax, h, line), 2 * GiB) << "never below the reserve line";
  EXPECT_EQ(pressure_line(512 * MiB, 3 * GiB, h, line), 3 * GiB - 512 * MiB)
      << "the relief could not reach the headroom: from what it left";
  EXPECT_EQ(pressure_line(512 * MiB, 5 * GiB, h, line), h - 512 * MiB) << "more than the headroom left: the headroom";
  EXPECT_EQ(pressure_line(1 * GiB, h, h, h), h) << "no slack (pin_reserve at the headroom): the headroom";
  EXPECT_EQ(pressure_line(1 * GiB, h, h, 6 * GiB), h) << "a reserve line above the headroom: no slack";
  EXPECT_EQ(pressure_line(kMax, 1 * GiB, h, 0), 0u) << "saturates at 0";
  EXPECT_EQ(pressure_line(kMax, kMax, kMax, 0), 0u);
}

}  // namespace
}  // namespace pins
