// Note [Shared pins] through the balancer: two Runtimes in one process play two
// processes (each attaches with its own open file description, so its own
// slot). A miss of a source in a mapped file fills and publishes a segment; the
// other Runtime's miss joins it without a fill; frees drop leases; the last
// lease removes the segment; a source written through its mapping stays private.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "csrc/files/mapped.h"
#include "csrc/runtime/runtime.h"
#include "tests/csrc/share/chaos_pattern.h"
#include "tests/csrc/share/share_file_test.h"

namespace pins {
namespace {

namespace fs = std::filesystem;

class ShareBalancer : public ShareFileTest {
 protected:
  ShareBalancer() : ShareFileTest("pins-share-bal") {}
  std::unique_ptr<Runtime> runtime(bool share = true, uint64_t cap = 0) const { return runtime_in(root_, share, cap); }
  // True when the bytes the cast got are the file's.
  static bool cast(Balancer& bal, const Request& r, bool* filled = nullptr) {
    const std::vector<char> out = cast_bytes(bal, r, filled);
    return testing::first_wrong_byte(out.data(), r.key.offset, r.bytes) == r.bytes;
  }
  size_t segments() const { return segments_in(dir_); }
};

TEST_F(ShareBalancer, SecondRuntimeJoinsWhatTheFirstFilled) {
  auto a = runtime(), b = runtime();
  const ModelId ma = a->balancer().register_model("m", "cpu"), mb = b->balancer().register_model("m", "cpu");
  for (uint64_t l = 0; l < kLayers; ++l) {
    bool filled = false;
    ASSERT_TRUE(cast(a->balancer(), request(ma, l), &filled));
    EXPECT_TRUE(filled);
  }
  EXPECT_EQ(a->share()->stats().fills, kLayers);
  EXPECT_EQ(a->share()->stats().published, kLayers);
  EXPECT_EQ(segments(), kLayers);
  for (uint64_t l = 0; l < kLayers; ++l) {
    bool filled = true;
    ASSERT_TRUE(cast(b->balancer(), request(mb, l), &filled));
    EXPECT_FALSE(filled) << "a join: the segment holds the bytes already";
  }
  EXPECT_EQ(b->share()->stats().joins, kLayers);
  EXPECT_EQ(b->pool().stats().adopted_bytes.current, static_cast<int64_t>(kLayers * kLayer));
  EXPECT_EQ(b->pool().stats().committed_bytes.current, 0) << "no RAM of its own";
  EXPECT_EQ(b->share()->stats().bytes, kLayers * kLayer) << "the host counts each segment once";
  // Hits from then on, in both.
  ASSERT_TRUE(cast(b->balancer(), request(mb, 0)));
  ASSERT_TRUE(cast(a->balancer(), request(ma, 0)));
  // b frees its pins: a's leases keep the segments; a frees too: they go.
  b->balancer().forget_model(mb);
  EXPECT_EQ(segments(), kLayers);
  a->balancer().forget_model(ma);
  EXPECT_EQ(segments(), 0u);
  EXPECT_EQ(a->pool().stats().adopted_bytes.current, 0);
}

TEST_F(ShareBalancer, AnEvictedSharedPinIsFilledAgainAfterTheLastLeaseWent) {
  auto a = runtime();
  Balancer& bal = a->balancer();
  const ModelId m = bal.register_model("m", "cpu");
  ASSERT_TRUE(cast(bal, request(m, 1)));
  EXPECT_EQ(segments(), 1u);
  EXPECT_GT(bal.free(kLayer, /*evict_active=*/true), 0u);
  EXPECT_EQ(segments(), 0u);
  bool filled = false;
  ASSERT_TRUE(cast(bal, request(m, 1), &filled));
  EXPECT_TRUE(filled);
  EXPECT_EQ(a->share()->stats().fills, 2u);
}

TEST_F(ShareBalancer, ASourceWrittenThroughItsMappingIsPinnedPrivately) {
  // A writable private mapping of the same file: a page written through it is
  // the process's own, so its pin must not be the file's segment.
  auto writable = files::MappedFile::open(path_);
  writable->data()[2 * kLayer] ^= 1;
  auto a = runtime();
  Balancer& bal = a->balancer();
  const ModelId m = bal.register_model("m", "cpu");
  Request r = request(m, 2);
  r.data = writable->data() + 2 * kLayer;
  Lease l = bal.acquire(r);
  ASSERT_TRUE(l && l.needs_fill());
  EXPECT_FALSE(l.shared_fill());
  ASSERT_FALSE(files::fill_from_file(r.data, r.bytes, l.data(), 1, false)) << "written: not from the file";
  std::memcpy(l.data(), r.data, r.bytes);
  l.filled();
  EXPECT_EQ(static_cast<const char*>(l.data())[0], writable->data()[2 * kLayer]) << "the written byte is served";
  EXPECT_EQ(a->share()->stats().fills, 0u);
  EXPECT_EQ(segments(), 0u);
}

// Note [Cap budget]: the pool adopts a shared segment outside its cap, so a
// pin of one takes no room there: with the cap full of private pins (a
// writable mapping's written layers), it evicts none of them.
TEST_F(ShareBalancer, ASharedPinTakesNoRoomUnderTheCap) {
  auto writable = files::MappedFile::open(path_);
  auto a = runtime(/*share=*/true, /*cap=*/2 * kLayer);
  Balancer& bal = a->balancer();
  const ModelId mine = bal.register_model("private", "cpu"), m = bal.register_model("m", "cpu");
  for (uint64_t layer = 0; layer < 2; ++layer) {
    writable->data()[layer * kLayer] ^= 1;
    Request r = request(mine, layer);
    r.data = writable->data() + layer * kLayer;
    Lease l = bal.acquire(r);
    ASSERT_TRUE(l && l.needs_fill() && !l.shared_fill()) << layer;
    std::memcpy(l.data(), r.data, r.bytes);
    l.filled();
  }
  ASSERT_EQ(a->pool().stats().committed_bytes.current, static_cast<int64_t>(2 * kLayer)) << "the cap is full";
  bal.mark_prompt({m});  // the private pins are another model's: tier 1, free to take
  ASSERT_TRUE(cast(bal, request(m, 2)));
  EXPECT_EQ(a->share()->stats().fills, 1u);
  EXPECT_EQ(a->pool().stats().adopted_bytes.current, static_cast<int64_t>(kLayer));
  EXPECT_EQ(bal.stats().total.evictions_all(), 0);
  EXPECT_EQ(bal.stats().bypassed_all(), 0);
  EXPECT_EQ(a->pool().stats().committed_bytes.current, static_cast<int64_t>(2 * kLayer));
}

TEST_F(ShareBalancer, ADroppedFillLeavesNoSegment) {
  auto a = runtime(), b = runtime();
  const ModelId ma = a->balancer().register_model("m", "cpu"), mb = b->balancer().register_model("m", "cpu");
  {
    Lease l = a->balancer().acquire(request(ma, 3));
    ASSERT_TRUE(l.shared_fill());
    // Dropped before filled(): the pin goes, and so does the Writing entry.
  }
  EXPECT_EQ(segments(), 0u);
  bool filled = false;
  ASSERT_TRUE(cast(b->balancer(), request(mb, 3), &filled));
  EXPECT_TRUE(filled) << "b fills it: nothing half-written was published";
}

TEST_F(ShareBalancer, SharingOffUsesThePoolAlone) {
  auto a = runtime(/*share=*/false);
  EXPECT_EQ(a->share(), nullptr);
  const ModelId m = a->balancer().register_model("m", "cpu");
  ASSERT_TRUE(cast(a->balancer(), request(m, 0)));
  EXPECT_EQ(a->pool().stats().adopted_bytes.current, 0);
  EXPECT_GT(a->pool().stats().committed_bytes.current, 0);
  EXPECT_FALSE(fs::exists(dir_));
}

}  // namespace
}  // namespace pins
