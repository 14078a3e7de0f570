// The bytes of ShareChaos's file: a function of the offset, so a worker checks
// what it got without reading the file.
#pragma once

#include <cstdint>
#include <cstring>

namespace pins::testing {

inline uint64_t chaos_word(uint64_t i) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Writes the pattern of [offset, offset + n) into dst; offset and n multiples of 8.
inline void chaos_fill(char* dst, uint64_t offset, uint64_t n) {
  for (uint64_t i = 0; i < n; i += 8) {
    const uint64_t w = chaos_word((offset + i) / 8);
    std::memcpy(dst + i, &w, 8);
  }
}

// The first byte of p (the file's [offset, offset + n)) that is wrong; n when none.
inline uint64_t first_wrong_byte(const char* p, uint64_t offset, uint64_t n) {
  for (uint64_t i = 0; i < n; i += 8) {
    const uint64_t w = chaos_word((offset + i) / 8);
    if (std::memcmp(p + i, &w, 8) != 0) return i;
  }
  return n;
}

}  // namespace pins::testing
