#include "csrc/config/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/base/check.h"
#include "tests/csrc/config/env.h"

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

std::string error_of_base(const std::string& text, const Config& base) {
  try {
    parse_config(text, base);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsMatchDesign) {
  const Config c = parse_config("");
  EXPECT_EQ(c.backend, BackendKind::Auto);
  EXPECT_EQ(c.policy, PolicyKind::Trace);  // docs/SIMULATOR.md "The default policy"
  EXPECT_FALSE(c.fast_disk);
  EXPECT_FALSE(c.content_check);  // Note [Content check]: off, for its cost on a cold hit (docs/PERFORMANCE.md)
  EXPECT_DOUBLE_EQ(c.ceiling_min, 0.40);
  EXPECT_DOUBLE_EQ(c.ceiling_max, 0.90);
  EXPECT_EQ(c.ceiling_reserve, 4 * GiB);
  EXPECT_EQ(c.ceiling_swap_reserve, 16 * GiB);
  EXPECT_EQ(c.pin_reserve, 2 * GiB);
  EXPECT_EQ(c.pin_slack, 256 * MiB);
  EXPECT_EQ(c.relieve_slack, 512 * MiB);
  EXPECT_EQ(c.lock_hysteresis, 2 * GiB);
  // What a configuration holds where the machine was not read (Note [Derived
  // budget]: the runtime derives both from the machine instead).
  EXPECT_EQ(c.headroom, 4 * GiB);
  EXPECT_EQ(c.pin_reserve, 2 * GiB);
  EXPECT_TRUE(c.monitor) << "the pressure monitor is what makes the smaller derived headroom safe";
  EXPECT_EQ(c.monitor_interval_ms, 200u);
}

TEST(Config, ParsesEveryKindOfValue) {
  const Config c = parse_config(
      " backend:null , policy:TRACE,fast_disk:true,headroom:6GiB,cap:512M,alignment:64,"
      "ceiling_max:0.5,retain_free:0,mlock:off,segment_size:1g,system_root:/tmp/fixture,content_check:ON,");
  EXPECT_EQ(c.backend, BackendKind::Null);
  EXPECT_EQ(c.policy, PolicyKind::Trace);
  EXPECT_EQ(parse_config("policy:reuse").policy, PolicyKind::Reuse);
  EXPECT_EQ(parse_config("backend:hip").backend, BackendKind::Hip);
  EXPECT_EQ(parse_config(format_config(parse_config("backend:HIP"))).backend, BackendKind::Hip);
  EXPECT_EQ(parse_config(format_config(parse_config("policy:reuse"))).policy, PolicyKind::Reuse);
  EXPECT_TRUE(c.fast_disk);
  EXPECT_EQ(c.headroom, 6 * GiB);
  EXPECT_EQ(c.cap, 512 * MiB);
  EXPECT_EQ(c.alignment, 64u);
  EXPECT_DOUBLE_EQ(c.ceiling_max, 0.5);
  EXPECT_EQ(c.retain_free, 0u);
  EXPECT_FALSE(c.mlock);
  EXPECT_TRUE(c.content_check);
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
      {"backend:tpu", {"backend", "tpu", "cuda", "hip"}},
      {"policy:fifo", {"policy", "fifo", "trace"}},
      {"fast_disk:maybe", {"fast_disk", "maybe"}},
      {"content_check:sometimes", {"content_check", "sometimes"}},
      {"mlock:2", {"mlock", "2"}},
      {"ceiling_min:1.5", {"ceiling_min", "1.5"}},
      {"ceiling_max:x", {"ceiling_max", "x"}},
      {"ceiling_min:0.9,ceiling_max:0.5", {"ceiling_min", "ceiling_max", "0.5"}},
      {"alignment:48", {"alignment", "48"}},
      {"alignment:8192", {"alignment", "8192"}},
      {"segment_size:4K", {"segment_size", "4K"}},
      {"monitor_interval_ms:0", {"monitor_interval_ms", "0"}},
      {"prewarm:sometimes", {"prewarm", "sometimes"}},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.text);
    ASSERT_FALSE(msg.empty()) << "no error for '" << c.text << "'";
    for (const char* m : c.mentions) EXPECT_NE(msg.find(m), std::string::npos) << "'" << msg << "' lacks " << m;
  }
}

// Note [Configuration bounds]: each bound, just inside (accepted) and just
// outside (refused with a message naming the key and the value as written).
TEST(Config, EveryBoundJustInsideAndJustOutside) {
  struct Bound {
    std::string key;
    std::vector<std::string> inside;
    std::vector<std::string> outside;
    std::string with = "";  // other keys the case needs
  };
  const std::string max_bytes = std::to_string(kMaxConfigBytes);          // 256TiB
  const std::string past_max = std::to_string(kMaxConfigBytes + 1);
  const std::vector<Bound> bounds = {
      {"segment_size", {"65536", "1T"}, {"65535", "1099511627777", "18446744073709551615"}, "extent_min:4K"},
      {"extent_min", {"4096", "64M"}, {"4095", "0", "67108865", "4G"}},
      {"alignment", {"1", "4096", "512"}, {"0", "3", "8192", "18446744073709551615"}},
      {"cap", {"0", "256T", max_bytes}, {past_max, "18446744073709551615"}},
      {"retain_free", {"0", max_bytes}, {past_max, "16777216T"}},
      {"headroom", {"0", max_bytes}, {past_max}},
      {"pin_reserve", {"0", max_bytes}, {past_max, "18446744073709551615"}},
      {"pin_slack", {"0", max_bytes}, {past_max}},
      {"relieve_slack", {"0", max_bytes}, {past_max}},
      {"ceiling_reserve", {"0", max_bytes}, {past_max}},
      {"ceiling_swap_reserve", {"0", max_bytes}, {past_max}},
      {"lock_hysteresis", {"0", max_bytes}, {past_max}},
      {"ceiling_min", {"0", "0.9"}, {"-0.1", "0.9000001", "nan", "inf"}, "ceiling_max:0.9"},
      {"ceiling_max", {"0.4", "1"}, {"0.3999999", "1.0000001", "2"}, "ceiling_min:0.4"},
      {"monitor_interval_ms", {"1", "60000"}, {"0", "60001", "1K", "1.5", "-1"}},
      {"memory_max_age_us", {"0", "1000000"}, {"1000001", "1K", "1.5", "-1"}},
      {"system_root", {"/", "/tmp/x y"}, {""}},
  };
  for (const Bound& b : bounds) {
    const std::string prefix = b.with.empty() ? "" : b.with + ",";
    for (const std::string& v : b.inside) {
      SCOPED_TRACE(b.key + ":" + v);
      EXPECT_NO_THROW(parse_config(prefix + b.key + ":" + v));
    }
    for (const std::string& v : b.outside) {
      SCOPED_TRACE(b.key + ":" + v);
      const std::string msg = error_of(prefix + b.key + ":" + v);
      ASSERT_FALSE(msg.empty()) << "accepted";
      EXPECT_NE(msg.find("'" + b.key + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(v.empty() ? "''" : v), std::string::npos) << msg;
    }
  }
}

TEST(Config, BoundsBetweenKeys) {
  EXPECT_NO_THROW(parse_config("segment_size:1M,extent_min:1M"));
  std::string msg = error_of("segment_size:1M,extent_min:1052672");
  EXPECT_NE(msg.find("'extent_min' (1028KiB)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'segment_size' (1MiB)"), std::string::npos) << msg;
  msg = error_of("extent_min:64M,segment_size:32M");  // whatever the order of the keys
  EXPECT_NE(msg.find("extent_min"), std::string::npos) << msg;
  EXPECT_NO_THROW(parse_config("ceiling_min:0.5,ceiling_max:0.5"));
  msg = error_of("ceiling_min:0.50001,ceiling_max:0.5");
  EXPECT_NE(msg.find("'ceiling_min' (0.50001)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'ceiling_max' (0.5)"), std::string::npos) << msg;
}

// The two values: a pin_reserve of 2^64 - 1 (which the budget could
// only saturate on) and an extent of 4 GiB committed for a 4 KiB pin.
TEST(Config, RefusesTheValuesThatBrokeTheBudget) {
  EXPECT_NE(error_of("pin_reserve:18446744073709551615").find("'pin_reserve' must be at most 256TiB"),
            std::string::npos);
  EXPECT_NE(error_of("extent_min:4G").find("'extent_min' must be from 4KiB to 64MiB, got '4G'"), std::string::npos);
}

// A base that did not come from text is checked too.
TEST(Config, ChecksTheBase) {
  Config base;
  base.pin_reserve = UINT64_MAX;
  EXPECT_NE(error_of_base("", base).find("'pin_reserve'"), std::string::npos);
  base = Config{};
  base.extent_min = 8 * MiB;
  base.segment_size = 4 * MiB;
  EXPECT_NE(error_of_base("headroom:1G", base).find("extent_min"), std::string::npos);
  EXPECT_NO_THROW(parse_config("segment_size:8M", base));
}

TEST(Config, FractionsIgnoreTheLocale) {
  // from_chars: "0,5" is not a number whatever LC_NUMERIC says.
  EXPECT_DOUBLE_EQ(parse_config("ceiling_min:0.25").ceiling_min, 0.25);
  EXPECT_DOUBLE_EQ(parse_config("ceiling_min:.25").ceiling_min, 0.25);
  EXPECT_DOUBLE_EQ(parse_config("ceiling_min:25e-2").ceiling_min, 0.25);
  EXPECT_FALSE(error_of("ceiling_min:0,5").empty());
  EXPECT_FALSE(error_of("ceiling_min:0x0.8").empty());
}

TEST(Config, FormatReadsBackExactly) {
  const Config d;
  EXPECT_EQ(parse_config(format_config(d)), d);
  const Config c = parse_config(
      "backend:null,segment_size:3M,extent_min:12345,alignment:64,cap:1.5G,retain_free:0,mlock:on,policy:trace,"
      "fast_disk:1,content_check:yes,headroom:256T,pin_reserve:7,pin_slack:1KB,relieve_slack:0,ceiling_min:0.1,"
      "ceiling_max:0.30000000000000004,ceiling_reserve:1,ceiling_swap_reserve:2,lock_hysteresis:3,monitor:yes,"
      "monitor_interval_ms:60000,memory_max_age_us:0,system_root:/tmp/a b:c,prewarm:off");
  const std::string text = format_config(c);
  EXPECT_EQ(parse_config(text), c) << text;
  EXPECT_NE(text.find("ceiling_max:0.30000000000000004"), std::string::npos) << text;
  EXPECT_NE(text.find("system_root:/tmp/a b:c"), std::string::npos) << text;
  EXPECT_FALSE(c.prewarm);
  EXPECT_TRUE(d.prewarm) << "Note [Prewarm]: on by default";
  // Every key once, in config_keys() order.
  size_t at = 0;
  for (const std::string& k : config_keys()) {
    const size_t p = text.find(k + ":", at);
    ASSERT_NE(p, std::string::npos) << k << " in " << text;
    at = p + k.size();
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

// Note [Derived budget]: min(clamp(R/16, 1 GiB, 4 GiB), R/4), rounded down to
// a MiB; pin_reserve half of it.
TEST(DerivedBudget, ScalesWithRam) {
  struct Case {
    uint64_t ram, headroom;
  };
  for (const Case& k : {Case{128 * GiB, 4 * GiB}, {96 * GiB, 4 * GiB}, {64 * GiB, 4 * GiB}, {48 * GiB, 3 * GiB},
                        {32 * GiB, 2 * GiB}, {24 * GiB, 1536 * MiB}, {16 * GiB, 1 * GiB}, {8 * GiB, 1 * GiB},
                        {4 * GiB, 1 * GiB}, {2 * GiB, 512 * MiB}, {1 * GiB, 256 * MiB}, {0, 0}}) {
    SCOPED_TRACE(k.ram);
    const DerivedBudget d = derive_budget(k.ram, 0);
    EXPECT_EQ(d.headroom, k.headroom);
    EXPECT_EQ(d.pin_reserve, k.headroom / 2);
    EXPECT_EQ(d.basis, BudgetBasis::Ram);
    EXPECT_EQ(d.basis_bytes, k.ram);
  }
  // A 16 GB machine's MemTotal is below 16 GiB: the floor holds it at 1 GiB.
  EXPECT_EQ(derive_budget(15'900'000'000, 0).headroom, 1 * GiB);
  // This project's VM (MemTotal 24683792 kB): R/16 is 1506.5 MiB, rounded down.
  EXPECT_EQ(derive_budget(24683792 * KiB, 0).headroom, 1506 * MiB);
  EXPECT_EQ(derive_budget(24683792 * KiB, 0).pin_reserve, 753 * MiB);
}

TEST(DerivedBudget, ACgroupLimitBelowRamIsR) {
  const DerivedBudget d = derive_budget(64 * GiB, 8 * GiB);
  EXPECT_EQ(d.headroom, 1 * GiB);
  EXPECT_EQ(d.basis, BudgetBasis::CgroupLimit);
  EXPECT_EQ(d.basis_bytes, 8 * GiB);
  const DerivedBudget small = derive_budget(64 * GiB, 2 * GiB);
  EXPECT_EQ(small.headroom, 512 * MiB);
  EXPECT_EQ(small.pin_reserve, 256 * MiB);
  // A limit equal to RAM is the basis (the runtime's reading of a limited
  // cgroup gives both as one number); one above it limits nothing.
  EXPECT_EQ(derive_budget(6 * GiB, 6 * GiB).basis, BudgetBasis::CgroupLimit);
  for (const uint64_t limit : {uint64_t{65} * GiB, uint64_t{1} * TiB, ~uint64_t{0}}) {
    const DerivedBudget d = derive_budget(64 * GiB, limit);
    EXPECT_EQ(d.basis, BudgetBasis::Ram);
    EXPECT_EQ(d.headroom, 4 * GiB);
  }
}

// Over every R, the headroom never falls as R grows, never exceeds a quarter of
// R nor 4 GiB, and is a whole number of MiB within the configuration's bounds.
TEST(DerivedBudget, MonotoneAndBounded) {
  uint64_t last = 0;
  for (uint64_t r = 0; r <= 300 * GiB; r += 97 * MiB + 12345) {
    const DerivedBudget d = derive_budget(r, 0);
    EXPECT_GE(d.headroom, last) << r;
    EXPECT_LE(d.headroom, r / 4) << r;
    EXPECT_LE(d.headroom, 4 * GiB) << r;
    EXPECT_EQ(d.headroom % MiB, 0u) << r;
    EXPECT_EQ(d.pin_reserve, d.headroom / 2) << r;
    last = d.headroom;
    Config c;
    c.headroom = d.headroom;
    c.pin_reserve = d.pin_reserve;
    EXPECT_NO_THROW(parse_config("", c));
  }
  EXPECT_EQ(derive_budget(~uint64_t{0}, 0).headroom, 4 * GiB);
}

TEST(ConfigSources, KeysSetByAText) {
  EXPECT_EQ(keys_set_by(""), std::vector<std::string>{});
  // config_keys() order, each once, case-insensitive, spaces and empty entries ignored.
  EXPECT_EQ(keys_set_by(" POLICY:lru,,headroom:1G, policy:mru ,cap:0"),
            (std::vector<std::string>{"cap", "headroom", "policy"}));
}

TEST(ConfigSources, TheMachineGivesHeadroomAndPinReserveUnlessTheTextSetsThem) {
  const DerivedBudget d = derive_budget(16 * GiB, 0);
  SourcedConfig s = sourced_config("", d);
  EXPECT_EQ(s.config.headroom, 1 * GiB);
  EXPECT_EQ(s.config.pin_reserve, 512 * MiB);
  ASSERT_EQ(s.sources.size(), config_keys().size());
  for (const std::string& k : config_keys())
    EXPECT_EQ(s.sources[k], k == "headroom" || k == "pin_reserve" ? ConfigSource::Machine : ConfigSource::Default) << k;
  EXPECT_THROW(s.sources.at("nope"), std::out_of_range);
  EXPECT_EQ(describe_source(s.sources["headroom"], s.derived), "derived from the machine: RAM 16.00 GiB");

  s = sourced_config("headroom:3G,policy:trace", d);
  EXPECT_EQ(s.config.headroom, 3 * GiB);
  EXPECT_EQ(s.config.pin_reserve, 512 * MiB) << "pin_reserve is still the machine's";
  EXPECT_EQ(s.config.policy, PolicyKind::Trace);
  EXPECT_EQ(s.sources["headroom"], ConfigSource::Env);
  EXPECT_EQ(s.sources["policy"], ConfigSource::Env);
  EXPECT_EQ(s.sources["pin_reserve"], ConfigSource::Machine);
  EXPECT_EQ(s.sources["cap"], ConfigSource::Default);

  // No reading of the machine: Config's fixed defaults, said to be defaults.
  s = sourced_config("", std::nullopt);
  EXPECT_EQ(s.config, Config{});
  EXPECT_EQ(s.sources["headroom"], ConfigSource::Default);

  const SourcedConfig limited = sourced_config("", derive_budget(64 * GiB, 6 * GiB));
  EXPECT_EQ(limited.config.headroom, 1 * GiB);
  EXPECT_EQ(describe_source(ConfigSource::Machine, limited.derived), "derived from the machine: cgroup limit 6.00 GiB");

  EXPECT_THROW(sourced_config("headroom:lots", d), ValueError);
  EXPECT_THROW(sourced_config("pin_reserve:1P", d), ValueError);
}

TEST(ConfigSources, EachSourceSaysWhereItCameFrom) {
  EXPECT_EQ(describe_source(ConfigSource::Default, std::nullopt), "default");
  EXPECT_EQ(describe_source(ConfigSource::Env, std::nullopt), "PINS_CONF");
  EXPECT_EQ(describe_source(ConfigSource::Configure, std::nullopt), "configure()");
  EXPECT_EQ(describe_source(ConfigSource::Given, std::nullopt), "given");
  EXPECT_EQ(describe_source(ConfigSource::Machine, std::nullopt), "derived from the machine");
  for (const ConfigSource s : {ConfigSource::Default, ConfigSource::Machine, ConfigSource::Env,
                               ConfigSource::Configure, ConfigSource::Given})
    EXPECT_EQ(describe_source(s, derive_budget(24683792 * KiB, 0)).find(','), std::string::npos)
        << "a ',' would split pins::config_sources()'s text";
}

TEST(Config, ReadsEnvironment) {
  ASSERT_EQ(testing::set_env("PINS_CONF", "policy:lru,headroom:1G"), 0);
  const Config c = config_from_env();
  EXPECT_EQ(c.policy, PolicyKind::Lru);
  EXPECT_EQ(c.headroom, GiB);
  ASSERT_EQ(testing::set_env("PINS_CONF", "policy:nope"), 0);
  EXPECT_THROW(config_from_env(), ValueError);
  testing::unset_env("PINS_CONF");
  EXPECT_EQ(config_from_env().policy, PolicyKind::Trace);
}

}  // namespace
}  // namespace pins
