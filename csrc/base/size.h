// The one byte-size syntax of pins, shared by PINS_CONF and the simulator's
// traces.
//
// Note [Size syntax]
// A size is a non-negative number, optionally with a fraction, followed by an
// optional unit (case-insensitive, white space allowed between):
//   (none), B                          bytes
//   K, M, G, T and KiB, MiB, GiB, TiB  binary: 2^10, 2^20, 2^30, 2^40
//   KB, MB, GB, TB                     decimal: 10^3, 10^6, 10^9, 10^12
// so "4G" and "4GiB" are 4 * 2^30 bytes and "2.5GB" is 2.5 * 10^9 bytes. A
// fractional result is rounded to the nearest byte. A value past 2^64 - 1, a
// negative or non-finite number and any other unit are errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace pins {

constexpr uint64_t KiB = 1ull << 10;
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t TiB = 1ull << 40;

// Bytes for `text` (Note [Size syntax]); nullopt when it is not a size.
std::optional<uint64_t> parse_size(std::string_view text);

// The multiplier of a unit such as "GiB" or "GB" (Note [Size syntax]);
// nullopt for an unknown unit. Also used for rates such as "3GB/s".
std::optional<double> size_unit(std::string_view unit);

}  // namespace pins
