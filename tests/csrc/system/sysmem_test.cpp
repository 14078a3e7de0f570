// pin_ceiling (sysmem.cpp), the same on every system, and the probe's reading
// of this machine (/proc and the cgroups on Linux, GlobalMemoryStatusEx and the
// job object on Windows).
#include "csrc/system/sysmem.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "csrc/base/size.h"

namespace pins {
namespace {

MemoryInfo ram(uint64_t total, uint64_t swap) {
  MemoryInfo m;
  m.total = total;
  m.available = total;
  m.swap_total = swap;
  m.swap_free = swap;
  return m;
}

// Default config: max(0.40 R, min(0.90 R, R - 4 GiB, R + swap - 16 GiB)).
TEST(PinCeiling, SwapReserveWins) {
  // R=32 GiB, no swap: max(12.8, min(28.8, 28, 16)) = 16 GiB.
  EXPECT_EQ(pin_ceiling(ram(32 * GiB, 0), Config{}), 16 * GiB);
  // 8 GiB swap: max(12.8, min(28.8, 28, 24)) = 24 GiB.
  EXPECT_EQ(pin_ceiling(ram(32 * GiB, 8 * GiB), Config{}), 24 * GiB);
}

TEST(PinCeiling, FixedReserveWins) {
  // R=32 GiB, 32 GiB swap: max(12.8, min(28.8, 28, 48)) = 28 GiB.
  EXPECT_EQ(pin_ceiling(ram(32 * GiB, 32 * GiB), Config{}), 28 * GiB);
}

TEST(PinCeiling, FractionOfRamWins) {
  // R=64 GiB, 64 GiB swap: max(25.6, min(57.6, 60, 112)) = 57.6 GiB, floored.
  EXPECT_EQ(pin_ceiling(ram(64 * GiB, 64 * GiB), Config{}), 61847529062u);  // 0.9 * 68719476736
}

TEST(PinCeiling, FloorWinsWhenTheReservesLeaveLittle) {
  // R=16 GiB, no swap: max(6.4, min(14.4, 12, 0)) = 6.4 GiB = 6871947673.6 bytes.
  EXPECT_EQ(pin_ceiling(ram(16 * GiB, 0), Config{}), 6871947673u);
  // R=8 GiB: R + swap - 16 GiB is below zero; max(3.2, min(7.2, 4, 0)) = 3.2 GiB.
  EXPECT_EQ(pin_ceiling(ram(8 * GiB, 0), Config{}), 3435973836u);
  // R=2 GiB: R - 4 GiB is below zero too.
  EXPECT_EQ(pin_ceiling(ram(2 * GiB, 0), Config{}), 858993459u);
}

TEST(PinCeiling, SubtractionsSaturate) {
  Config c;
  c.ceiling_min = 0;
  EXPECT_EQ(pin_ceiling(ram(8 * GiB, 0), c), 0u);
  EXPECT_EQ(pin_ceiling(ram(0, 0), Config{}), 0u);
  // R + swap does not wrap: max(12.8, min(28.8, 28, huge)) = 28 GiB.
  EXPECT_EQ(pin_ceiling(ram(32 * GiB, std::numeric_limits<uint64_t>::max()), Config{}), 28 * GiB);
}

TEST(PinCeiling, FollowsTheConfig) {
  Config c;
  c.ceiling_min = 0.5;
  c.ceiling_max = 0.75;
  c.ceiling_reserve = 1 * GiB;
  c.ceiling_swap_reserve = 0;
  // R=16 GiB, no swap: max(8, min(12, 15, 16)) = 12 GiB.
  EXPECT_EQ(pin_ceiling(ram(16 * GiB, 0), c), 12 * GiB);
  c.ceiling_max = 1.0;
  c.ceiling_reserve = 0;
  EXPECT_EQ(pin_ceiling(ram(16 * GiB, 0), c), 16 * GiB);  // never above R
}

TEST(SystemMemoryProbe, ThisMachineIsConsistent) {
  const MemoryInfo m = SystemMemoryProbe().read();
  EXPECT_GT(m.total, 0u);
  EXPECT_GT(m.available, 0u);
  EXPECT_LE(m.available, m.total);
  EXPECT_LE(m.swap_free, m.swap_total);
  const uint64_t ceiling = pin_ceiling(m, Config{});
  EXPECT_GT(ceiling, 0u);
  EXPECT_LE(ceiling, m.total);
}

}  // namespace
}  // namespace pins
