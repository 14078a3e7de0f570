#include "csrc/base/size.h"

#include <charconv>
#include <cmath>
#include <string>

#include "csrc/base/text.h"

namespace pins {

std::optional<double> size_unit(std::string_view unit) {
  const std::string u = lower(trim(unit));
  if (u.empty() || u == "b") return 1.0;
  if (u == "k" || u == "kib") return static_cast<double>(KiB);
  if (u == "m" || u == "mib") return static_cast<double>(MiB);
  if (u == "g" || u == "gib") return static_cast<double>(GiB);
  if (u == "t" || u == "tib") return static_cast<double>(TiB);
  if (u == "kb") return 1e3;
  if (u == "mb") return 1e6;
  if (u == "gb") return 1e9;
  if (u == "tb") return 1e12;
  return std::nullopt;
}

std::optional<uint64_t> parse_size(std::string_view text) {
  const std::string_view t = trim(text);
  if (t.empty() || !(std::isdigit(static_cast<unsigned char>(t.front())) || t.front() == '.')) return std::nullopt;
  // Whole numbers stay exact in integers: 2^64 - 1 does not survive a double.
  uint64_t whole = 0;
  const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), whole);
  const std::string_view after_int(p, t.data() + t.size() - p);
  if (ec == std::errc() && (after_int.empty() || after_int.front() != '.')) {
    const std::string u = lower(trim(after_int));
    uint64_t mult = 0;
    if (u.empty() || u == "b") mult = 1;
    else if (u == "k" || u == "kib") mult = KiB;
    else if (u == "m" || u == "mib") mult = MiB;
    else if (u == "g" || u == "gib") mult = GiB;
    else if (u == "t" || u == "tib") mult = TiB;
    else if (u == "kb") mult = 1000ull;
    else if (u == "mb") mult = 1000ull * 1000;
    else if (u == "gb") mult = 1000ull * 1000 * 1000;
    else if (u == "tb") mult = 1000ull * 1000 * 1000 * 1000;
    else return std::nullopt;
    if (whole != 0 && mult > UINT64_MAX / whole) return std::nullopt;
    return whole * mult;
  }
  if (ec == std::errc::result_out_of_range) return std::nullopt;
  double v = 0;
  const auto [q, ec2] = std::from_chars(t.data(), t.data() + t.size(), v, std::chars_format::fixed);
  if (ec2 != std::errc() || !std::isfinite(v) || v < 0) return std::nullopt;
  const std::optional<double> mult = size_unit(std::string_view(q, t.data() + t.size() - q));
  if (!mult) return std::nullopt;
  const double bytes = std::nearbyint(v * *mult);
  if (!(bytes < 18446744073709551616.0)) return std::nullopt;  // 2^64
  return static_cast<uint64_t>(bytes);
}

}  // namespace pins
