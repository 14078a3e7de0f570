// SystemMemoryProbe on Linux (sysmem_linux.cpp): fixture roots of /proc and
// the cgroup files, and this machine.
#include "csrc/system/sysmem.h"

#include <gtest/gtest.h>

#include "tests/csrc/system/fixture_root.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "csrc/base/check.h"

namespace pins {
namespace {

namespace fs = std::filesystem;

using testing::FixtureRoot;

// A meminfo in the kernel's layout; the values are in GiB. SwapCached and the
// unit-less HugePages lines are there to catch sloppy key matching.
std::string meminfo(uint64_t total_gib, uint64_t avail_gib, uint64_t swap_total_gib = 0,
                    uint64_t swap_free_gib = 0) {
  const auto kb = [](uint64_t gib) { return std::to_string(gib * GiB / KiB); };
  return "MemTotal:       " + kb(total_gib) + " kB\n" +
         "MemFree:        1234 kB\n"
         "MemAvailable:   " + kb(avail_gib) + " kB\n" +
         "Cached:         5678 kB\n"
         "SwapCached:     999 kB\n"
         "SwapTotal:      " + kb(swap_total_gib) + " kB\n" +
         "SwapFree:       " + kb(swap_free_gib) + " kB\n" +
         "HugePages_Total:       0\n"
         "Hugepagesize:       2048 kB\n";
}

std::string bytes(uint64_t n) { return std::to_string(n) + "\n"; }

MemoryInfo probe(const FixtureRoot& root) { return SystemMemoryProbe(root.path()).read(); }

// ---------------------------------------------------------------- one fixture root, one reading
//
// Most cases are files under a fresh root and what the probe must make of them:
// the fields it must read, or the ResourceError it must throw. A case checks
// only the fields it names; the others stay empty.

using Files = std::vector<std::pair<std::string, std::string>>;  // root-relative path, content

struct Reading {
  std::string name;
  Files files = {};
  std::optional<uint64_t> total = {};
  std::optional<uint64_t> available = {};
  std::optional<uint64_t> swap_total = {};
  std::optional<uint64_t> swap_free = {};
  std::optional<bool> cgroup_limited = {};
};

struct Refusal {
  std::string name;
  Files files = {};
  std::vector<std::string> names_files = {};  // root-relative paths the message must name
  std::vector<std::string> quotes = {};       // what else it must say
};

// A failure names its case rather than dumping its bytes.
void PrintTo(const Reading& c, std::ostream* os) { *os << c.name; }
void PrintTo(const Refusal& c, std::ostream* os) { *os << c.name; }

template <typename Case>
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name;
}

class SystemMemoryProbeReading : public ::testing::TestWithParam<Reading> {};

TEST_P(SystemMemoryProbeReading, MatchesTheCase) {
  const Reading& c = GetParam();
  FixtureRoot root;
  for (const auto& [rel, text] : c.files) root.write(rel, text);
  const MemoryInfo m = probe(root);
  if (c.total) {
    EXPECT_EQ(m.total, *c.total);
  }
  if (c.available) {
    EXPECT_EQ(m.available, *c.available);
  }
  if (c.swap_total) {
    EXPECT_EQ(m.swap_total, *c.swap_total);
  }
  if (c.swap_free) {
    EXPECT_EQ(m.swap_free, *c.swap_free);
  }
  if (c.cgroup_limited) {
    EXPECT_EQ(m.cgroup_limited, *c.cgroup_limited);
  }
}

class SystemMemoryProbeRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(SystemMemoryProbeRefusal, ThrowsResourceError) {
  const Refusal& c = GetParam();
  FixtureRoot root;
  for (const auto& [rel, text] : c.files) root.write(rel, text);
  try {
    probe(root);
    FAIL() << "expected ResourceError";
  } catch (const ResourceError& e) {
    const std::string msg = e.what();
    for (const std::string& rel : c.names_files) EXPECT_NE(msg.find(root.file(rel)), std::string::npos) << msg;
    for (const std::string& quote : c.quotes) EXPECT_NE(msg.find(quote), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------- meminfo

INSTANTIATE_TEST_SUITE_P(Meminfo, SystemMemoryProbeReading,
                         ::testing::Values(Reading{
                             .name = "PlainHostReadsMeminfoInBytes",
                             .files = {{"proc/meminfo", meminfo(32, 20, 8, 6)}},
                             .total = 32 * GiB,
                             .available = 20 * GiB,
                             .swap_total = 8 * GiB,
                             .swap_free = 6 * GiB,
                             .cgroup_limited = false,
                         }),
                         case_name<Reading>);

INSTANTIATE_TEST_SUITE_P(Meminfo, SystemMemoryProbeRefusal,
                         ::testing::Values(
                             Refusal{
                                 .name = "MissingMeminfoNamesThePath",
                                 .names_files = {"proc/meminfo"},
                             },
                             Refusal{
                                 .name = "MalformedMeminfoNamesFileAndContent",
                                 .files = {{"proc/meminfo", "MemTotal:       12x4 kB\nMemAvailable:   100 kB\n"}},
                                 .names_files = {"proc/meminfo"},
                                 .quotes = {"12x4"},
                             },
                             Refusal{
                                 .name = "MeminfoWithoutMemAvailableIsAnError",
                                 .files = {{"proc/meminfo", "MemTotal:       1000 kB\nMemFree:   100 kB\n"}},
                                 .quotes = {"MemAvailable"},
                             }),
                         case_name<Refusal>);

// ---------------------------------------------------------------- cgroup v2

INSTANTIATE_TEST_SUITE_P(
    CgroupV2, SystemMemoryProbeReading,
    ::testing::Values(
        Reading{
            .name = "RootCgroupWithoutLimitFilesIsUnlimited",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/\n"},
                      {"sys/fs/cgroup/memory.current", bytes(31 * GiB)}},  // no memory.max next to it
            .total = 32 * GiB,
            .available = 20 * GiB,
            .cgroup_limited = false,
        },
        Reading{
            .name = "LimitBelowMemTotalBoundsTotalAndAvailable",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/user.slice/job\n"},
                      {"sys/fs/cgroup/user.slice/job/memory.max", bytes(8 * GiB)},
                      {"sys/fs/cgroup/user.slice/job/memory.current", bytes(6 * GiB)}},
            .total = 8 * GiB,
            .available = 2 * GiB,
            .cgroup_limited = true,
        },
        Reading{
            .name = "NestedParentTighterThanChild",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/a/b\n"},
                      {"sys/fs/cgroup/a/memory.max", bytes(4 * GiB)},
                      {"sys/fs/cgroup/a/memory.current", bytes(3 * GiB)},  // the parent counts its other children
                      {"sys/fs/cgroup/a/b/memory.max", bytes(8 * GiB)},
                      {"sys/fs/cgroup/a/b/memory.current", bytes(1 * GiB)}},
            .total = 4 * GiB,
            .available = 1 * GiB,
            .cgroup_limited = true,
        },
        Reading{
            .name = "ChildRoomTighterThanParentRoom",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/a/b\n"},
                      {"sys/fs/cgroup/a/memory.max", bytes(16 * GiB)},
                      {"sys/fs/cgroup/a/memory.current", bytes(7 * GiB)},
                      {"sys/fs/cgroup/a/b/memory.max", bytes(6 * GiB)},
                      {"sys/fs/cgroup/a/b/memory.current", bytes(5 * GiB)}},
            .total = 6 * GiB,
            .available = 1 * GiB,
        },
        Reading{
            .name = "MaxMeansNoLimit",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/job\n"},
                      {"sys/fs/cgroup/job/memory.max", "max\n"},
                      {"sys/fs/cgroup/job/memory.current", bytes(30 * GiB)}},
            .total = 32 * GiB,
            .available = 20 * GiB,
            .cgroup_limited = false,
        },
        Reading{
            .name = "LimitAboveMemTotalStillBoundsAvailable",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/job\n"},
                      {"sys/fs/cgroup/job/memory.max", bytes(64 * GiB)},
                      {"sys/fs/cgroup/job/memory.current", bytes(61 * GiB)}},
            .total = 32 * GiB,
            .available = 3 * GiB,
            .cgroup_limited = false,
        },
        Reading{
            .name = "UsageAboveLimitSaturatesAtZero",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/job\n"},
                      {"sys/fs/cgroup/job/memory.max", bytes(4 * GiB)},
                      {"sys/fs/cgroup/job/memory.current", bytes(4 * GiB + 4096)}},
            .total = 4 * GiB,
            .available = 0,
        },
        Reading{
            .name = "SwapMaxBoundsSwap",
            .files = {{"proc/meminfo", meminfo(32, 20, 16, 10)},
                      {"proc/self/cgroup", "0::/a/b\n"},
                      {"sys/fs/cgroup/a/memory.swap.max", "max\n"},
                      {"sys/fs/cgroup/a/b/memory.swap.max", bytes(4 * GiB)},
                      {"sys/fs/cgroup/a/b/memory.swap.current", bytes(1 * GiB)}},
            .total = 32 * GiB,  // no memory.max anywhere
            .swap_total = 4 * GiB,
            .swap_free = 3 * GiB,
            .cgroup_limited = false,
        },
        Reading{
            .name = "SwapMaxZeroMeansNoSwap",
            .files = {{"proc/meminfo", meminfo(32, 20, 16, 10)},
                      {"proc/self/cgroup", "0::/job\n"},
                      {"sys/fs/cgroup/job/memory.swap.max", "0\n"}},
            .swap_total = 0,
            .swap_free = 0,
        },
        // A container that mounts its own cgroup at /sys/fs/cgroup but shows the
        // host's path in /proc/self/cgroup.
        Reading{
            .name = "MissingLeafFallsBackToHierarchyRoot",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "0::/system.slice/docker-abc.scope\n"},
                      {"sys/fs/cgroup/memory.max", bytes(8 * GiB)},
                      {"sys/fs/cgroup/memory.current", bytes(2 * GiB)}},
            .total = 8 * GiB,
            .available = 6 * GiB,
        }),
    case_name<Reading>);

INSTANTIATE_TEST_SUITE_P(CgroupV2, SystemMemoryProbeRefusal,
                         ::testing::Values(Refusal{
                             .name = "MalformedLimitNamesFileAndContent",
                             .files = {{"proc/meminfo", meminfo(32, 20)},
                                       {"proc/self/cgroup", "0::/job\n"},
                                       {"sys/fs/cgroup/job/memory.max", "12G\n"}},
                             .names_files = {"sys/fs/cgroup/job/memory.max"},
                             .quotes = {"'12G'"},
                         }),
                         case_name<Refusal>);

TEST(SystemMemoryProbe, InactiveFileCacheCountsAsAvailable) {
  FixtureRoot root;
  root.write("proc/meminfo", meminfo(32, 20));
  root.write("proc/self/cgroup", "0::/job\n");
  root.write("sys/fs/cgroup/job/memory.max", bytes(8 * GiB));
  root.write("sys/fs/cgroup/job/memory.current", bytes(7 * GiB));
  root.write("sys/fs/cgroup/job/memory.stat", "anon 3221225472\nfile 4294967296\nactive_file 1073741824\n"
                                              "inactive_file 3221225472\nslab 1\n");
  EXPECT_EQ(probe(root).available, 4 * GiB) << "8 - (7 - 3 inactive file)";
  root.write("sys/fs/cgroup/job/memory.stat", "anon 1\ninactive_file x\n");
  EXPECT_THROW(probe(root), ResourceError);
}

TEST(SystemMemoryProbe, CachesTheCgroupPathButRereadsItsFiles) {
  FixtureRoot root;
  root.write("proc/meminfo", meminfo(32, 20));
  root.write("proc/self/cgroup", "0::/job\n");
  root.write("sys/fs/cgroup/job/memory.max", bytes(8 * GiB));
  root.write("sys/fs/cgroup/other/memory.max", bytes(2 * GiB));
  SystemMemoryProbe p(root.path());
  EXPECT_EQ(p.read().total, 8 * GiB);
  root.write("proc/self/cgroup", "0::/other\n");  // not looked at again
  root.write("sys/fs/cgroup/job/memory.max", bytes(6 * GiB));
  root.write("proc/meminfo", meminfo(32, 5));
  const MemoryInfo m = p.read();
  EXPECT_EQ(m.total, 6 * GiB);
  EXPECT_EQ(m.available, 5 * GiB);
}

// ---------------------------------------------------------------- cgroup v1

INSTANTIATE_TEST_SUITE_P(
    CgroupV1, SystemMemoryProbeReading,
    ::testing::Values(
        Reading{
            .name = "LimitAndUsage",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n"},
                      {"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", bytes(8 * GiB)},
                      {"sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", bytes(5 * GiB)},
                      // A hybrid system's v2 root: the memory controller is on v1, so this is ignored.
                      {"sys/fs/cgroup/memory.max", bytes(1 * GiB)}},
            .total = 8 * GiB,
            .available = 3 * GiB,
            .cgroup_limited = true,
        },
        Reading{
            .name = "InactiveFileCacheCountsAsAvailable",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "4:memory:/job\n0::/\n"},
                      {"sys/fs/cgroup/memory/job/memory.limit_in_bytes", bytes(8 * GiB)},
                      {"sys/fs/cgroup/memory/job/memory.usage_in_bytes", bytes(7 * GiB)},
                      {"sys/fs/cgroup/memory/job/memory.stat", "inactive_file 99\ntotal_inactive_file 2147483648\n"}},
            .available = 3 * GiB,
        },
        Reading{
            .name = "MissingPathFallsBackToControllerRoot",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "4:memory:/docker/abc\n"},
                      {"sys/fs/cgroup/memory/memory.limit_in_bytes", bytes(8 * GiB)},
                      {"sys/fs/cgroup/memory/memory.usage_in_bytes", bytes(7 * GiB)}},
            .total = 8 * GiB,
            .available = 1 * GiB,
        },
        Reading{
            .name = "UnlimitedValueIsNoLimit",
            .files = {{"proc/meminfo", meminfo(32, 20)},
                      {"proc/self/cgroup", "4:memory:/docker/abc\n"},
                      {"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n"},
                      {"sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", bytes(31 * GiB)}},
            .total = 32 * GiB,
            .available = 20 * GiB,
            .cgroup_limited = false,
        }),
    case_name<Reading>);

INSTANTIATE_TEST_SUITE_P(CgroupV1, SystemMemoryProbeRefusal,
                         ::testing::Values(Refusal{
                             .name = "MaxIsNotAcceptedAsANumber",
                             .files = {{"proc/meminfo", meminfo(32, 20)},
                                       {"proc/self/cgroup", "4:memory:/\n"},
                                       {"sys/fs/cgroup/memory/memory.limit_in_bytes", "max\n"}},
                         }),
                         case_name<Refusal>);

}  // namespace
}  // namespace pins
