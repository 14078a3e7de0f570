#include "csrc/config/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "csrc/base/check.h"
#include "csrc/base/size.h"
#include "csrc/base/text.h"

namespace pins {

const char* to_string(PolicyKind k) {
  switch (k) {
    case PolicyKind::Mru: return "mru";
    case PolicyKind::Lru: return "lru";
    case PolicyKind::Trace: return "trace";
    case PolicyKind::Reuse: return "reuse";
  }
  return "?";
}

namespace {

uint64_t size_value(std::string_view v, std::string_view key) {
  const std::optional<uint64_t> n = parse_size(v);
  PINS_CHECK_VALUE(n.has_value(), "PINS_CONF key '", key,
                   "' expects a byte size such as 4096, 512M or 4GiB (Note [Size syntax]), got '", v, "'");
  return *n;
}

// A size as docs/USAGE.md's bounds column writes it: "64KiB", "256TiB", "4096".
std::string size_text(uint64_t n) {
  for (const auto& [unit, name] : {std::pair{TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}})
    if (n >= unit && n % unit == 0) return detail::cat(n / unit, name);
  return detail::cat(n);
}

// Note [Configuration bounds]: `n` (written `v` in the text) within [lo, hi].
void check_bounds(uint64_t n, uint64_t lo, uint64_t hi, std::string_view key, std::string_view v) {
  PINS_CHECK_VALUE(n >= lo && n <= hi, "PINS_CONF key '", key, "' must be ",
                   lo == 0 ? detail::cat("at most ", size_text(hi))
                           : detail::cat("from ", size_text(lo), " to ", size_text(hi)),
                   ", got '", v, "'");
}

// The shortest text that reads back as `d` exactly.
std::string fraction_text(double d) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, ec == std::errc() ? end : buf);
}

bool parse_bool(std::string_view v, std::string_view key) {
  const std::string s = lower(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  throw ValueError(detail::cat("PINS_CONF key '", key, "' expects a boolean (true/false), got '", v, "'"));
}

// Locale-independent (strtod reads "0,5" under a German LC_NUMERIC).
double parse_fraction(std::string_view v, std::string_view key) {
  double d = -1;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  PINS_CHECK_VALUE(!v.empty() && ec == std::errc() && end == v.data() + v.size() && d >= 0.0 && d <= 1.0,
                   "PINS_CONF key '", key, "' expects a fraction from 0 to 1, got '", v, "'");
  return d;
}

// A whole number of milliseconds: digits only.
uint64_t parse_count(std::string_view v, std::string_view key) {
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  PINS_CHECK_VALUE(!v.empty() && ec == std::errc() && end == v.data() + v.size(), "PINS_CONF key '", key,
                   "' expects a whole number of milliseconds, got '", v, "'");
  return n;
}

template <typename E>
E parse_enum(std::string_view v, std::string_view key, std::initializer_list<std::pair<const char*, E>> names) {
  const std::string s = lower(v);
  std::string choices;
  for (const auto& [n, e] : names) {
    if (s == n) return e;
    choices += choices.empty() ? n : detail::cat("|", n);
  }
  throw ValueError(detail::cat("PINS_CONF key '", key, "' expects one of ", choices, ", got '", v, "'"));
}

// A byte-size key and its bounds (Note [Configuration bounds]).
struct SizeKey {
  const char* name;
  uint64_t Config::*field;
  uint64_t lo;
  uint64_t hi;
};

constexpr SizeKey kSizeKeys[] = {
    {"segment_size", &Config::segment_size, kMinSegmentSize, kMaxSegmentSize},
    {"extent_min", &Config::extent_min, kMinExtentMin, kMaxExtentMin},
    {"cap", &Config::cap, 0, kMaxConfigBytes},
    {"retain_free", &Config::retain_free, 0, kMaxConfigBytes},
    {"headroom", &Config::headroom, 0, kMaxConfigBytes},
    {"pin_reserve", &Config::pin_reserve, 0, kMaxConfigBytes},
    {"pin_slack", &Config::pin_slack, 0, kMaxConfigBytes},
    {"relieve_slack", &Config::relieve_slack, 0, kMaxConfigBytes},
    {"ceiling_reserve", &Config::ceiling_reserve, 0, kMaxConfigBytes},
    {"ceiling_swap_reserve", &Config::ceiling_swap_reserve, 0, kMaxConfigBytes},
    {"lock_hysteresis", &Config::lock_hysteresis, 0, kMaxConfigBytes},
};

using Setter = std::function<void(Config&, std::string_view value, std::string_view key)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> m = [] {
    std::map<std::string, Setter> s;
    auto boolean = [](bool Config::*f) {
      return Setter([f](Config& c, std::string_view v, std::string_view k) { c.*f = parse_bool(v, k); });
    };
    auto fraction = [](double Config::*f) {
      return Setter([f](Config& c, std::string_view v, std::string_view k) { c.*f = parse_fraction(v, k); });
    };
    for (const SizeKey& sk : kSizeKeys) {
      s[sk.name] = [sk](Config& c, std::string_view v, std::string_view k) {
        const uint64_t n = size_value(v, k);
        check_bounds(n, sk.lo, sk.hi, k, v);
        c.*sk.field = n;
      };
    }
    s["backend"] = [](Config& c, std::string_view v, std::string_view k) {
      c.backend = parse_enum<BackendKind>(v, k, {{"auto", BackendKind::Auto}, {"cuda", BackendKind::Cuda},
                                                 {"hip", BackendKind::Hip}, {"cpu", BackendKind::Cpu},
                                                 {"null", BackendKind::Null}});
    };
    s["alignment"] = [](Config& c, std::string_view v, std::string_view k) {
      const uint64_t n = size_value(v, k);
      PINS_CHECK_VALUE(n >= 1 && n <= kMaxAlignment && (n & (n - 1)) == 0,
                       "PINS_CONF key 'alignment' must be a power of two from 1 to 4096, got '", v, "'");
      c.alignment = n;
    };
    s["mlock"] = boolean(&Config::mlock);
    s["policy"] = [](Config& c, std::string_view v, std::string_view k) {
      c.policy = parse_enum<PolicyKind>(v, k, {{"mru", PolicyKind::Mru}, {"lru", PolicyKind::Lru},
                                               {"trace", PolicyKind::Trace}, {"reuse", PolicyKind::Reuse}});
    };
    s["fast_disk"] = boolean(&Config::fast_disk);
    s["content_check"] = boolean(&Config::content_check);
    s["ceiling_min"] = fraction(&Config::ceiling_min);
    s["ceiling_max"] = fraction(&Config::ceiling_max);
    s["monitor"] = boolean(&Config::monitor);
    s["prewarm"] = boolean(&Config::prewarm);
    s["monitor_interval_ms"] = [](Config& c, std::string_view v, std::string_view k) {
      const uint64_t n = parse_count(v, k);
      PINS_CHECK_VALUE(n >= 1 && n <= kMaxMonitorIntervalMs,
                       "PINS_CONF key 'monitor_interval_ms' must be from 1 to 60000, got '", v, "'");
      c.monitor_interval_ms = n;
    };
    s["memory_max_age_us"] = [](Config& c, std::string_view v, std::string_view k) {
      const uint64_t n = parse_count(v, k);
      PINS_CHECK_VALUE(n <= kMaxMemoryMaxAgeUs, "PINS_CONF key 'memory_max_age_us' must be from 0 to 1000000, got '",
                       v, "'");
      c.memory_max_age_us = n;
    };
    s["system_root"] = [](Config& c, std::string_view v, std::string_view) {
      PINS_CHECK_VALUE(!v.empty(), "PINS_CONF key 'system_root' must name a directory, got ''");
      c.system_root = std::string(v);
    };
    s["share"] = boolean(&Config::share);
    s["share_dir"] = [](Config& c, std::string_view v, std::string_view) {
      PINS_CHECK_VALUE(!v.empty(), "PINS_CONF key 'share_dir' must name a directory, got ''");
      c.share_dir = std::string(v);
    };
    return s;
  }();
  return m;
}

// The whole configuration against Note [Configuration bounds]: the keys that
// bound each other, and a `base` that did not come from text.
void check_config(const Config& c) {
  for (const SizeKey& sk : kSizeKeys) check_bounds(c.*sk.field, sk.lo, sk.hi, sk.name, std::to_string(c.*sk.field));
  PINS_CHECK_VALUE(c.alignment >= 1 && c.alignment <= kMaxAlignment && (c.alignment & (c.alignment - 1)) == 0,
                   "PINS_CONF key 'alignment' must be a power of two from 1 to 4096, got '", c.alignment, "'");
  PINS_CHECK_VALUE(c.monitor_interval_ms >= 1 && c.monitor_interval_ms <= kMaxMonitorIntervalMs,
                   "PINS_CONF key 'monitor_interval_ms' must be from 1 to 60000, got '", c.monitor_interval_ms, "'");
  PINS_CHECK_VALUE(c.memory_max_age_us <= kMaxMemoryMaxAgeUs,
                   "PINS_CONF key 'memory_max_age_us' must be from 0 to 1000000, got '", c.memory_max_age_us, "'");
  for (const auto& [key, f] : {std::pair{"ceiling_min", c.ceiling_min}, {"ceiling_max", c.ceiling_max}})
    PINS_CHECK_VALUE(f >= 0.0 && f <= 1.0, "PINS_CONF key '", key, "' expects a fraction from 0 to 1, got '",
                     fraction_text(f), "'");
  PINS_CHECK_VALUE(!c.system_root.empty(), "PINS_CONF key 'system_root' must name a directory, got ''");
  PINS_CHECK_VALUE(!c.share_dir.empty(), "PINS_CONF key 'share_dir' must name a directory, got ''");
  PINS_CHECK_VALUE(c.ceiling_min <= c.ceiling_max, "PINS_CONF key 'ceiling_min' (", fraction_text(c.ceiling_min),
                   ") must not exceed key 'ceiling_max' (", fraction_text(c.ceiling_max), ")");
  PINS_CHECK_VALUE(c.extent_min <= c.segment_size, "PINS_CONF key 'extent_min' (", size_text(c.extent_min),
                   ") must not exceed key 'segment_size' (", size_text(c.segment_size), ")");
}

}  // namespace

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& [name, _] : setters()) k.push_back(name);
    return k;
  }();
  return keys;
}

Config parse_config(std::string_view text, Config base) {
  Config c = std::move(base);
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    PINS_CHECK_VALUE(colon != std::string_view::npos, "PINS_CONF entry '", item,
                     "' is not of the form key:value");
    const std::string key = lower(trim(item.substr(0, colon)));
    const std::string_view value = trim(item.substr(colon + 1));
    const auto it = setters().find(key);
    if (it == setters().end()) {
      std::string known;
      for (const auto& k : config_keys()) known += known.empty() ? k : ", " + k;
      throw ValueError(detail::cat("PINS_CONF has unknown key '", key, "' (known keys: ", known, ")"));
    }
    it->second(c, value, key);
  }
  check_config(c);
  return c;
}

std::string format_config(const Config& c) {
  std::map<std::string, std::string> v;
  for (const SizeKey& sk : kSizeKeys) v[sk.name] = std::to_string(c.*sk.field);
  v["backend"] = to_string(c.backend);
  v["alignment"] = std::to_string(c.alignment);
  v["mlock"] = c.mlock ? "true" : "false";
  v["policy"] = to_string(c.policy);
  v["fast_disk"] = c.fast_disk ? "true" : "false";
  v["content_check"] = c.content_check ? "true" : "false";
  v["ceiling_min"] = fraction_text(c.ceiling_min);
  v["ceiling_max"] = fraction_text(c.ceiling_max);
  v["monitor"] = c.monitor ? "true" : "false";
  v["prewarm"] = c.prewarm ? "true" : "false";
  v["monitor_interval_ms"] = std::to_string(c.monitor_interval_ms);
  v["memory_max_age_us"] = std::to_string(c.memory_max_age_us);
  v["system_root"] = c.system_root;
  v["share"] = c.share ? "true" : "false";
  v["share_dir"] = c.share_dir;
  std::string out;
  for (const std::string& k : config_keys()) out += detail::cat(out.empty() ? "" : ",", k, ":", v.at(k));
  return out;
}

PoolOptions pool_options(const Config& c) {
  PoolOptions o;
  o.segment_size = c.segment_size;
  o.extent_min = c.extent_min;
  o.alignment = c.alignment;
  o.cap = c.cap;
  o.retain_free = c.retain_free;
  return o;
}

std::vector<std::string> keys_set_by(std::string_view text) {
  std::vector<bool> set(config_keys().size(), false);
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const std::string key = lower(trim(item.substr(0, item.find(':'))));
    for (size_t i = 0; i < config_keys().size(); ++i) set[i] = set[i] || config_keys()[i] == key;
  }
  std::vector<std::string> keys;
  for (size_t i = 0; i < set.size(); ++i)
    if (set[i]) keys.push_back(config_keys()[i]);
  return keys;
}

DerivedBudget derive_budget(uint64_t ram, uint64_t cgroup_limit) {
  DerivedBudget d;
  d.basis = cgroup_limit != 0 && cgroup_limit <= ram ? BudgetBasis::CgroupLimit : BudgetBasis::Ram;
  d.basis_bytes = d.basis == BudgetBasis::CgroupLimit ? cgroup_limit : ram;
  const uint64_t r = d.basis_bytes;
  d.headroom = std::min(std::clamp(r / 16, 1 * GiB, 4 * GiB), r / 4) / MiB * MiB;
  d.pin_reserve = d.headroom / 2;
  return d;
}

std::string describe_source(ConfigSource s, const std::optional<DerivedBudget>& derived) {
  switch (s) {
    case ConfigSource::Default: return "default";
    case ConfigSource::Machine: {
      if (!derived) return "derived from the machine";
      char gib[32];
      std::snprintf(gib, sizeof gib, "%.2f GiB", static_cast<double>(derived->basis_bytes) / static_cast<double>(GiB));
      return detail::cat("derived from the machine: ",
                         derived->basis == BudgetBasis::CgroupLimit ? "cgroup limit " : "RAM ", gib);
    }
    case ConfigSource::Env: return "PINS_CONF";
    case ConfigSource::Configure: return "configure()";
    case ConfigSource::Given: return "given";
  }
  return "?";
}

ConfigSources::ConfigSources(ConfigSource all) : by_key_(config_keys().size(), static_cast<unsigned char>(all)) {}

size_t ConfigSources::index(std::string_view key) const {
  const std::vector<std::string>& keys = config_keys();
  const auto it = std::find(keys.begin(), keys.end(), key);
  if (it == keys.end()) throw std::out_of_range(detail::cat("no configuration key '", key, "'"));
  return static_cast<size_t>(it - keys.begin());
}

ConfigSource ConfigSources::at(std::string_view key) const { return static_cast<ConfigSource>(by_key_[index(key)]); }

void ConfigSources::set(std::string_view key, ConfigSource s) { by_key_[index(key)] = static_cast<unsigned char>(s); }

SourcedConfig sourced_config(std::string_view env_text, const std::optional<DerivedBudget>& derived) {
  SourcedConfig s;
  Config base;
  if (derived) {
    base.headroom = derived->headroom;
    base.pin_reserve = derived->pin_reserve;
    s.sources.set("headroom", ConfigSource::Machine);
    s.sources.set("pin_reserve", ConfigSource::Machine);
    s.derived = derived;
  }
  s.config = parse_config(env_text, base);
  for (const std::string& k : keys_set_by(env_text)) s.sources.set(k, ConfigSource::Env);
  return s;
}

Config config_from_env() {
  const char* env = std::getenv("PINS_CONF");
  return parse_config(env ? std::string_view(env) : std::string_view());
}

}  // namespace pins
