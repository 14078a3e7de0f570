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

namespace pins {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kLayer = 256 * 1024;
constexpr uint64_t kLayers = 4;

class ShareBalancer : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string root = (fs::is_directory("/dev/shm") ? std::string("/dev/shm") : fs::temp_directory_path().string()) +
                       "/pins-share-bal-XXXXXX";
    ASSERT_NE(mkdtemp(root.data()), nullptr);
    root_ = root;
    dir_ = root_ + "/pins-" + std::to_string(geteuid());
    path_ = (fs::temp_directory_path() / ("pins-share-bal-" + std::to_string(getpid()) + ".bin")).string();
    std::vector<char> buf(kLayers * kLayer);
    testing::chaos_fill(buf.data(), 0, buf.size());
    const int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, buf.data(), buf.size()), static_cast<ssize_t>(buf.size()));
    ::close(fd);
    file_ = files::MappedFile::open(path_);
  }
  void TearDown() override {
    file_.reset();
    fs::remove(path_);
    fs::remove_all(root_);
  }

  std::unique_ptr<Runtime> runtime(bool share = true) {
    Config c;
    c.share = share;
    c.share_dir = root_;
    c.backend = BackendKind::Cpu;
    c.monitor = false;
    c.prewarm = false;
    c.headroom = 0;
    c.pin_reserve = 0;
    return std::make_unique<Runtime>(c);
  }

  Request request(ModelId m, uint64_t layer) const {
    Request r;
    r.model = m;
    r.key = PinKey{7, layer * kLayer, kLayer, 0};
    r.bytes = kLayer;
    r.data = file_->data() + layer * kLayer;
    return r;
  }

  // A cast as ops/cast_path.cpp makes it; true when the bytes it got are the file's.
  static bool cast(Balancer& bal, const Request& r, bool* filled = nullptr) {
    Lease l = bal.acquire(r);
    if (filled != nullptr) *filled = l && l.needs_fill();
    if (l && l.needs_fill()) {
      if (!files::fill_from_file(r.data, r.bytes, l.data(), 1, l.shared_fill()))
        std::memcpy(l.data(), r.data, r.bytes);
      l.filled();
    }
    std::vector<char> out(r.bytes);
    std::memcpy(out.data(), l ? l.data() : r.data, r.bytes);
    return testing::first_wrong_byte(out.data(), r.key.offset, r.bytes) == r.bytes;
  }

  size_t segments() const {
    if (!fs::is_directory(dir_)) return 0;
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().filename().string().rfind("seg-", 0) == 0;
    return n;
  }

  std::string root_, dir_, path_;
  std::shared_ptr<files::MappedFile> file_;
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
