// Note [Content check]: which windows of a source a pin samples, and what a
// comparison of them catches and misses.
#include "csrc/balancer/content_check.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <stdexcept>
#include <vector>

namespace pins {
namespace {

// Every window lies in [0, n), in offset order, disjoint; their bytes sum to
// at most kContentWindows x kContentWindowBytes.
void expect_well_formed(const std::vector<Window>& w, uint64_t n) {
  ASSERT_LE(w.size(), static_cast<size_t>(kContentWindows));
  uint64_t end = 0;
  for (const Window& x : w) {
    EXPECT_GE(x.offset, end) << "in order and disjoint";
    EXPECT_GT(x.bytes, 0u);
    EXPECT_LE(x.bytes, kContentWindowBytes);
    EXPECT_LE(x.offset + x.bytes, n);
    end = x.offset + x.bytes;
  }
}

TEST(ContentWindows, ASmallSourceIsComparedWhole) {
  EXPECT_TRUE(content_windows(0, 7).empty());
  for (uint64_t n : {1ull, 2ull, 31ull, 32ull, 33ull, 96ull, 100ull, 128ull}) {
    SCOPED_TRACE(n);
    const std::vector<Window> w = content_windows(n, 7);
    expect_well_formed(w, n);
    uint64_t covered = 0;
    for (const Window& x : w) covered += x.bytes;
    EXPECT_EQ(covered, n) << "the windows tile the source";
  }
}

TEST(ContentWindows, ALargeSourceHasItsFirstAndLastBytesAndOneWindowInEachHalf) {
  for (uint64_t n : {129ull, 160ull, 4096ull, 4097ull, 1ull << 20, (1ull << 33) + 6}) {
    for (uint64_t seed : {0ull, 1ull, 42ull, ~0ull}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " seed " << seed);
      const std::vector<Window> w = content_windows(n, seed);
      expect_well_formed(w, n);
      ASSERT_EQ(w.size(), 4u);
      EXPECT_EQ(w[0], (Window{0, kContentWindowBytes}));
      EXPECT_EQ(w[3], (Window{n - kContentWindowBytes, kContentWindowBytes}));
      EXPECT_EQ(w[1].offset % kContentWindowBytes, 0u);
      EXPECT_EQ(w[2].offset % kContentWindowBytes, 0u);
      EXPECT_LE(w[1].offset, n / 2 + kContentWindowBytes) << "the first drawn window in the first half";
      EXPECT_GE(w[2].offset + kContentWindowBytes, n / 2 - kContentWindowBytes) << "the second in the second half";
      EXPECT_EQ(content_windows(n, seed), w) << "fixed by the seed";
    }
  }
}

TEST(ContentWindows, TheDrawnWindowsMoveWithTheSeed) {
  std::set<uint64_t> first, second;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    const std::vector<Window> w = content_windows(1 << 20, seed);
    first.insert(w[1].offset);
    second.insert(w[2].offset);
  }
  EXPECT_GT(first.size(), 32u);
  EXPECT_GT(second.size(), 32u);
}

TEST(ContentWindows, WindowsHoldWholeElementsOfEveryElementSize) {
  for (uint64_t el : {1ull, 2ull, 4ull, 8ull, 16ull})
    for (uint64_t elements : {1ull, 3ull, 8ull, 9ull, 1000ull, 12345ull}) {
      const uint64_t n = el * elements;
      for (const Window& x : content_windows(n, elements)) {
        EXPECT_EQ(x.offset % el, 0u) << "el " << el << " n " << n;
        EXPECT_EQ(x.bytes % el, 0u) << "el " << el << " n " << n;
      }
    }
}

// A float buffer of `n` values, as a weight.
std::vector<float> weights(size_t n) {
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = 0.001f * static_cast<float>(i % 997) - 0.5f;
  return w;
}

ContentSample sample_of(const std::vector<float>& w, uint64_t seed) {
  ContentSample s;
  const char* base = reinterpret_cast<const char*>(w.data());
  for (const Window& x : content_windows(w.size() * sizeof(float), seed)) s.add(base, x.offset, x.bytes);
  return s;
}

TEST(ContentSample, MatchesItsSourceAndAnyCopyOfIt) {
  const std::vector<float> w = weights(4096);
  const ContentSample s = sample_of(w, 3);
  EXPECT_EQ(s.windows(), 4);
  EXPECT_EQ(s.reach(), w.size() * sizeof(float));
  EXPECT_TRUE(s.matches(reinterpret_cast<const char*>(w.data())));
  const std::vector<float> copy = w;
  EXPECT_TRUE(s.matches(reinterpret_cast<const char*>(copy.data())));
}

// What the issue asked about: a whole-tensor in-place write (w.mul_(2)).
TEST(ContentSample, CatchesAWholeTensorWrite) {
  for (size_t n : {1ul, 7ul, 32ul, 33ul, 4096ul, 1ul << 18}) {
    std::vector<float> w = weights(n);
    const ContentSample s = sample_of(w, n);
    for (float& x : w) x *= 2;
    EXPECT_FALSE(s.matches(reinterpret_cast<const char*>(w.data()))) << n;
  }
}

TEST(ContentSample, CatchesAWriteToTheFirstOrLastElement) {
  std::vector<float> w = weights(1 << 16);
  const ContentSample s = sample_of(w, 9);
  w.front() += 1;
  EXPECT_FALSE(s.matches(reinterpret_cast<const char*>(w.data())));
  w.front() -= 1;
  EXPECT_TRUE(s.matches(reinterpret_cast<const char*>(w.data())));
  w.back() += 1;
  EXPECT_FALSE(s.matches(reinterpret_cast<const char*>(w.data())));
}

// The documented limit: a write outside every window is not seen.
TEST(ContentSample, MissesASparseWriteOutsideTheWindows) {
  std::vector<float> w = weights(1 << 16);
  const uint64_t seed = 11;
  const ContentSample s = sample_of(w, seed);
  const std::vector<Window> windows = content_windows(w.size() * sizeof(float), seed);
  const auto in_a_window = [&](size_t i) {
    for (const Window& x : windows)
      if (i * sizeof(float) >= x.offset && i * sizeof(float) < x.offset + x.bytes) return true;
    return false;
  };
  size_t outside = 1;
  while (in_a_window(outside)) ++outside;
  w[outside] += 1;
  EXPECT_TRUE(s.matches(reinterpret_cast<const char*>(w.data())));
}

TEST(ContentSample, TakesAtMostItsWindows) {
  const std::vector<float> w = weights(64);
  const char* base = reinterpret_cast<const char*>(w.data());
  ContentSample s;
  EXPECT_THROW(s.add(base, 0, kContentWindowBytes + 1), std::logic_error);
  for (int i = 0; i < kContentWindows; ++i) s.add(base, 8 * i, 8);
  EXPECT_THROW(s.add(base, 0, 8), std::logic_error);
  EXPECT_EQ(s.reach(), 8u * kContentWindows);
}

}  // namespace
}  // namespace pins
