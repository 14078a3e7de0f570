// libFuzzer target: parse_size (csrc/base/size.h, Note [Size syntax]) on any
// text. Properties beyond "no crash":
//  - case and surrounding white space do not change the result;
//  - a parsed size printed as a whole number of bytes reads back as itself,
//    and so does it in K/M/G/T when it is a multiple of the unit;
//  - any 64-bit number (from the input's first 8 bytes) printed in decimal
//    reads back as itself, and with ".0" when a double holds it exactly.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "csrc/base/size.h"
#include "fuzz/fuzz_check.h"

namespace {

std::string with_case(std::string_view s, int (*f)(int)) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(f(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pins;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::optional<uint64_t> v = parse_size(text);
  PINS_FUZZ_CHECK(parse_size(with_case(text, ::toupper)) == v, text);
  PINS_FUZZ_CHECK(parse_size(with_case(text, ::tolower)) == v, text);
  PINS_FUZZ_CHECK(parse_size(" \t" + text + " \n") == v, text);
  if (v) {
    PINS_FUZZ_CHECK(parse_size(std::to_string(*v)) == v, text);
    PINS_FUZZ_CHECK(parse_size(std::to_string(*v) + " B") == v, text);
    for (const auto& [unit, name] : {std::pair{KiB, "K"}, {MiB, "MiB"}, {GiB, "g"}, {TiB, "TiB"}})
      if (*v % unit == 0) PINS_FUZZ_CHECK(parse_size(std::to_string(*v / unit) + name) == v, text);
    for (const auto& [unit, name] : {std::pair{uint64_t{1000}, "KB"}, {uint64_t{1000000}, "mb"}})
      if (*v % unit == 0) PINS_FUZZ_CHECK(parse_size(std::to_string(*v / unit) + name) == v, text);
  }
  if (size >= 8) {
    uint64_t n = 0;
    std::memcpy(&n, data, 8);
    PINS_FUZZ_CHECK(parse_size(std::to_string(n)) == n, std::to_string(n));
    if (n < (uint64_t{1} << 53)) PINS_FUZZ_CHECK(parse_size(std::to_string(n) + ".0") == n, std::to_string(n));
  }
  return 0;
}
