#include "csrc/runtime/config.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <map>

#include "csrc/base/check.h"
#include "csrc/base/size.h"
#include "csrc/base/text.h"

namespace pins {

const char* to_string(PolicyKind k) {
  switch (k) {
    case PolicyKind::Mru: return "mru";
    case PolicyKind::Lru: return "lru";
    case PolicyKind::Trace: return "trace";
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

bool parse_bool(std::string_view v, std::string_view key) {
  const std::string s = lower(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  throw ValueError(detail::cat("PINS_CONF key '", key, "' expects a boolean (true/false), got '", v, "'"));
}

double parse_fraction(std::string_view v, std::string_view key) {
  const std::string s(v);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  PINS_CHECK_VALUE(!s.empty() && end == s.c_str() + s.size() && d >= 0.0 && d <= 1.0,
                   "PINS_CONF key '", key, "' expects a fraction in [0, 1], got '", v, "'");
  return d;
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

using Setter = std::function<void(Config&, std::string_view value, std::string_view key)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> m = [] {
    std::map<std::string, Setter> s;
    auto size = [](uint64_t Config::*f) {
      return Setter([f](Config& c, std::string_view v, std::string_view k) { c.*f = size_value(v, k); });
    };
    auto boolean = [](bool Config::*f) {
      return Setter([f](Config& c, std::string_view v, std::string_view k) { c.*f = parse_bool(v, k); });
    };
    auto fraction = [](double Config::*f) {
      return Setter([f](Config& c, std::string_view v, std::string_view k) { c.*f = parse_fraction(v, k); });
    };
    s["backend"] = [](Config& c, std::string_view v, std::string_view k) {
      c.backend = parse_enum<BackendKind>(v, k, {{"auto", BackendKind::Auto}, {"cuda", BackendKind::Cuda},
                                                 {"cpu", BackendKind::Cpu}, {"null", BackendKind::Null}});
    };
    s["segment_size"] = [](Config& c, std::string_view v, std::string_view k) {
      const uint64_t n = size_value(v, k);
      PINS_CHECK_VALUE(n >= 64 * KiB, "PINS_CONF key 'segment_size' must be at least 64KiB, got '", v, "'");
      c.segment_size = n;
    };
    s["extent_min"] = size(&Config::extent_min);
    s["alignment"] = [](Config& c, std::string_view v, std::string_view k) {
      const uint64_t n = size_value(v, k);
      PINS_CHECK_VALUE(n >= 1 && n <= 4096 && (n & (n - 1)) == 0,
                       "PINS_CONF key 'alignment' must be a power of two from 1 to 4096, got '", v, "'");
      c.alignment = n;
    };
    s["cap"] = size(&Config::cap);
    s["retain_free"] = size(&Config::retain_free);
    s["mlock"] = boolean(&Config::mlock);
    s["policy"] = [](Config& c, std::string_view v, std::string_view k) {
      c.policy = parse_enum<PolicyKind>(v, k, {{"mru", PolicyKind::Mru}, {"lru", PolicyKind::Lru},
                                               {"trace", PolicyKind::Trace}});
    };
    s["fast_disk"] = boolean(&Config::fast_disk);
    s["headroom"] = size(&Config::headroom);
    s["pin_reserve"] = size(&Config::pin_reserve);
    s["pin_slack"] = size(&Config::pin_slack);
    s["relieve_slack"] = size(&Config::relieve_slack);
    s["ceiling_min"] = fraction(&Config::ceiling_min);
    s["ceiling_max"] = fraction(&Config::ceiling_max);
    s["ceiling_reserve"] = size(&Config::ceiling_reserve);
    s["ceiling_swap_reserve"] = size(&Config::ceiling_swap_reserve);
    s["lock_hysteresis"] = size(&Config::lock_hysteresis);
    s["monitor"] = boolean(&Config::monitor);
    s["monitor_interval_ms"] = [](Config& c, std::string_view v, std::string_view k) {
      const uint64_t n = size_value(v, k);
      PINS_CHECK_VALUE(n >= 1 && n <= 60000, "PINS_CONF key 'monitor_interval_ms' must be 1..60000, got '", v, "'");
      c.monitor_interval_ms = n;
    };
    s["system_root"] = [](Config& c, std::string_view v, std::string_view) { c.system_root = std::string(v); };
    return s;
  }();
  return m;
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
  PINS_CHECK_VALUE(c.ceiling_min <= c.ceiling_max, "PINS_CONF ceiling_min (", c.ceiling_min,
                   ") must not exceed ceiling_max (", c.ceiling_max, ")");
  return c;
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

Config config_from_env() {
  const char* env = std::getenv("PINS_CONF");
  return parse_config(env ? std::string_view(env) : std::string_view());
}

}  // namespace pins
