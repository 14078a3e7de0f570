// Note [Source index]: which pins hold bytes of which storage.
#include "csrc/balancer/source_index.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace pins {
namespace {

Pin single(uint64_t storage, uint64_t offset, uint64_t nbytes, uint64_t span = 0) {
  Pin p;
  p.key = PinKey{storage, offset, nbytes, 0};
  p.span = span;
  return p;
}

Pin gathered(std::vector<SourcePart> parts) {
  Pin p;
  p.key = PinKey{parts.at(0).key.storage, parts.at(0).key.offset, 4096, 2};
  p.parts = std::move(parts);
  return p;
}

SourcePart part(uint64_t storage, uint64_t offset, uint64_t span) {
  return SourcePart{PinKey{storage, offset, span, 0}, span, std::nullopt};
}

TEST(SourceIndex, FindsExactlyTheOverlappingSourcesOfOneStorage) {
  Pin a = single(1, 0, 100), b = single(1, 100, 100), c = single(1, 300, 50), other = single(2, 0, 1000);
  SourceIndex idx;
  for (Pin* p : {&a, &b, &c, &other}) idx.add(p);
  using V = std::vector<Pin*>;
  EXPECT_EQ(idx.overlapping(1, 0, 1000), (V{&a, &b, &c}));
  EXPECT_EQ(idx.overlapping(1, 99, 101), (V{&a, &b})) << "one byte of each";
  EXPECT_EQ(idx.overlapping(1, 100, 200), (V{&b})) << "ranges are half-open";
  EXPECT_EQ(idx.overlapping(1, 200, 300), V{}) << "the gap between b and c";
  EXPECT_EQ(idx.overlapping(1, 349, 10000), (V{&c}));
  EXPECT_EQ(idx.overlapping(1, 50, 50), V{}) << "an empty range overlaps nothing";
  EXPECT_EQ(idx.overlapping(3, 0, 1000), V{}) << "an unknown storage";
  EXPECT_EQ(idx.storages(), 2u);
}

TEST(SourceIndex, ASpanLongerThanTheBytesIsWhatCounts) {
  // A strided view: 64 bytes of elements spread over 1000 bytes of its storage.
  Pin strided = single(1, 0, 64, 1000), later = single(1, 2000, 8);
  SourceIndex idx;
  idx.add(&strided);
  idx.add(&later);
  EXPECT_EQ(idx.overlapping(1, 900, 901), std::vector<Pin*>{&strided}) << "found from max_span back";
  EXPECT_EQ(idx.overlapping(1, 1000, 2000), std::vector<Pin*>{});
}

TEST(SourceIndex, AGatheredPinIsListedUnderEachPartOnce) {
  Pin g = gathered({part(1, 0, 64), part(2, 512, 32), part(1, 128, 16)});
  SourceIndex idx;
  idx.add(&g);
  EXPECT_EQ(idx.entries(), 3u);
  EXPECT_EQ(idx.overlapping(2, 520, 521), std::vector<Pin*>{&g});
  EXPECT_EQ(idx.overlapping(1, 0, 1000), std::vector<Pin*>{&g}) << "two parts in one storage, one pin";
  EXPECT_EQ(idx.overlapping(1, 64, 128), std::vector<Pin*>{}) << "between its parts";
  idx.remove(&g);
  EXPECT_EQ(idx.entries(), 0u);
  EXPECT_EQ(idx.storages(), 0u);
}

TEST(SourceIndex, RemoveTakesOnlyThatPinAndEmptySourcesAreNotListed) {
  Pin a = single(1, 0, 100), twin = single(1, 0, 100), empty = single(1, 50, 0);
  SourceIndex idx;
  idx.add(&a);
  idx.add(&twin);  // same bytes, another model
  idx.add(&empty);
  EXPECT_EQ(idx.entries(), 2u) << "a source of no bytes overlaps nothing";
  idx.remove(&a);
  EXPECT_EQ(idx.overlapping(1, 0, 100), std::vector<Pin*>{&twin});
  idx.remove(&a);  // not listed: nothing happens
  EXPECT_EQ(idx.entries(), 1u);
}

}  // namespace
}  // namespace pins
