#include "csrc/runtime/config.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "csrc/base/check.h"

namespace pins {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_config(text);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsMatchDesign) {
  const Config c = parse_config("");
  EXPECT_EQ(c.backend, BackendKind::Auto);
  EXPECT_EQ(c.policy, PolicyKind::Mru);
  EXPECT_FALSE(c.fast_disk);
  EXPECT_DOUBLE_EQ(c.ceiling_min, 0.40);
  EXPECT_DOUBLE_EQ(c.ceiling_max, 0.90);
  EXPECT_EQ(c.ceiling_reserve, 4 * GiB);
  EXPECT_EQ(c.ceiling_swap_reserve, 16 * GiB);
  EXPECT_EQ(c.pin_reserve, 2 * GiB);
  EXPECT_EQ(c.pin_slack, 256 * MiB);
  EXPECT_EQ(c.relieve_slack, 512 * MiB);
  EXPECT_EQ(c.lock_hysteresis, 2 * GiB);
}

TEST(Config, ParsesEveryKindOfValue) {
  const Config c = parse_config(
      " backend:null , policy:TRACE,fast_disk:true,headroom:6GiB,cap:512M,alignment:64,"
      "ceiling_max:0.5,retain_free:0,mlock:off,segment_size:1g,system_root:/tmp/fixture,");
  EXPECT_EQ(c.backend, BackendKind::Null);
  EXPECT_EQ(c.policy, PolicyKind::Trace);
  EXPECT_TRUE(c.fast_disk);
  EXPECT_EQ(c.headroom, 6 * GiB);
  EXPECT_EQ(c.cap, 512 * MiB);
  EXPECT_EQ(c.alignment, 64u);
  EXPECT_DOUBLE_EQ(c.ceiling_max, 0.5);
  EXPECT_EQ(c.retain_free, 0u);
  EXPECT_FALSE(c.mlock);
  EXPECT_EQ(c.segment_size, GiB);
  EXPECT_EQ(c.system_root, "/tmp/fixture");
}

TEST(Config, LaterKeysOverrideAndBaseIsKept) {
  Config base;
  base.headroom = 1 * GiB;
  const Config c = parse_config("cap:1K,cap:2K", base);
  EXPECT_EQ(c.cap, 2 * KiB);
  EXPECT_EQ(c.headroom, 1 * GiB);
}

TEST(Config, SizeSuffixes) {
  // Note [Size syntax]: bare and IEC units are binary, SI units decimal.
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size(" 4096 B "), 4096u);
  EXPECT_EQ(parse_size("4k"), 4 * KiB);
  EXPECT_EQ(parse_size("3MiB"), 3 * MiB);
  EXPECT_EQ(parse_size("2G"), 2 * GiB);
  EXPECT_EQ(parse_size("2GB"), 2000000000u);
  EXPECT_EQ(parse_size("2.5GB"), 2500000000u);
  EXPECT_EQ(parse_size("1.5 GiB"), 3 * GiB / 2);
  EXPECT_EQ(parse_size("1T"), TiB);
  EXPECT_EQ(parse_size("1TB"), 1000000000000u);
  EXPECT_EQ(parse_size("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_size("-1"), std::nullopt);
  EXPECT_EQ(parse_size(""), std::nullopt);
  EXPECT_EQ(parse_size("G"), std::nullopt);
  EXPECT_EQ(parse_size("99999999999999999999"), std::nullopt);
  EXPECT_EQ(parse_size("16777216T"), std::nullopt);
  EXPECT_EQ(parse_size("1e30"), std::nullopt);
  EXPECT_EQ(parse_size("16EiB"), std::nullopt);
  EXPECT_EQ(parse_size("2.5.1G"), std::nullopt);
  EXPECT_THROW(parse_config("headroom:4X"), ValueError);
}

// Every configuration error names the key and the value it got.
TEST(Config, ErrorsNameKeyAndValue) {
  struct Case {
    const char* text;
    std::vector<const char*> mentions;
  } cases[] = {
      {"bogus:1", {"bogus", "unknown key", "headroom"}},
      {"headroom", {"headroom", "key:value"}},
      {"headroom:lots", {"headroom", "lots"}},
      {"headroom:4X", {"headroom", "4X"}},
      {"backend:tpu", {"backend", "tpu", "cuda"}},
      {"policy:fifo", {"policy", "fifo", "trace"}},
      {"fast_disk:maybe", {"fast_disk", "maybe"}},
      {"mlock:2", {"mlock", "2"}},
      {"ceiling_min:1.5", {"ceiling_min", "1.5"}},
      {"ceiling_max:x", {"ceiling_max", "x"}},
      {"ceiling_min:0.9,ceiling_max:0.5", {"ceiling_min", "ceiling_max", "0.5"}},
      {"alignment:48", {"alignment", "48"}},
      {"alignment:8192", {"alignment", "8192"}},
      {"segment_size:4K", {"segment_size", "4K"}},
      {"monitor_interval_ms:0", {"monitor_interval_ms", "0"}},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.text);
    ASSERT_FALSE(msg.empty()) << "no error for '" << c.text << "'";
    for (const char* m : c.mentions) EXPECT_NE(msg.find(m), std::string::npos) << "'" << msg << "' lacks " << m;
  }
}

TEST(Config, KeysAreClosedAndListed) {
  const auto& keys = config_keys();
  EXPECT_GE(keys.size(), 20u);
  for (const auto& k : keys) EXPECT_NO_THROW(error_of(k + ":1")) << k;
}

TEST(Config, PoolOptionsComeFromThePoolKeys) {
  const PoolOptions o =
      pool_options(parse_config("segment_size:256MiB,extent_min:4MiB,alignment:64,cap:3GiB,retain_free:1MiB"));
  EXPECT_EQ(o.segment_size, 256 * MiB);
  EXPECT_EQ(o.extent_min, 4 * MiB);
  EXPECT_EQ(o.alignment, 64u);
  EXPECT_EQ(o.cap, 3 * GiB);
  EXPECT_EQ(o.retain_free, 1 * MiB);
  // The defaults of both agree.
  const PoolOptions d = pool_options(Config{});
  const PoolOptions plain;
  EXPECT_EQ(d.segment_size, plain.segment_size);
  EXPECT_EQ(d.extent_min, plain.extent_min);
  EXPECT_EQ(d.alignment, plain.alignment);
  EXPECT_EQ(d.cap, plain.cap);
  EXPECT_EQ(d.retain_free, plain.retain_free);
  EXPECT_STREQ(to_string(parse_config("backend:NULL").backend), "null");
}

TEST(Config, ReadsEnvironment) {
  ASSERT_EQ(setenv("PINS_CONF", "policy:lru,headroom:1G", 1), 0);
  const Config c = config_from_env();
  EXPECT_EQ(c.policy, PolicyKind::Lru);
  EXPECT_EQ(c.headroom, GiB);
  ASSERT_EQ(setenv("PINS_CONF", "policy:nope", 1), 0);
  EXPECT_THROW(config_from_env(), ValueError);
  unsetenv("PINS_CONF");
  EXPECT_EQ(config_from_env().policy, PolicyKind::Mru);
}

}  // namespace
}  // namespace pins
