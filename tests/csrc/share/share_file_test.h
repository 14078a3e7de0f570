// The fixture of the share tests that cast through runtimes in one process
// (share_balancer_test.cpp, share_robustness_test.cpp): a share root of its
// own (under /dev/shm where there is one), a file of kLayers layers of the
// chaos pattern mapped as the model's source, and the calls the tests make.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "csrc/files/mapped.h"
#include "csrc/runtime/runtime.h"
#include "tests/csrc/share/chaos_pattern.h"

namespace pins {

inline constexpr uint64_t kLayer = 256 * 1024;
inline constexpr uint64_t kLayers = 4;

class ShareFileTest : public ::testing::Test {
 protected:
  // `name`: the prefix of the share root and of the file.
  explicit ShareFileTest(std::string name) : name_(std::move(name)) {}

  void SetUp() override {
    namespace fs = std::filesystem;
    std::string root = (fs::is_directory("/dev/shm") ? std::string("/dev/shm") : fs::temp_directory_path().string()) +
                       "/" + name_ + "-XXXXXX";
    ASSERT_NE(mkdtemp(root.data()), nullptr);
    root_ = root;
    dir_ = root_ + "/pins-" + std::to_string(geteuid());
    path_ = (fs::temp_directory_path() / (name_ + "-" + std::to_string(getpid()) + ".bin")).string();
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
    std::filesystem::remove(path_);
    std::filesystem::remove_all(root_);
  }

  // A runtime as one process of the share in `share_dir` has it; `cap`, the pool's (0: none).
  static std::unique_ptr<Runtime> runtime_in(const std::string& share_dir, bool share, uint64_t cap = 0) {
    Config c;
    c.share = share;
    c.cap = cap;
    c.share_dir = share_dir;
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

  // A cast as ops/cast_path.cpp makes it: the bytes it got; `filled`, whether it filled a pin.
  static std::vector<char> cast_bytes(Balancer& bal, const Request& r, bool* filled = nullptr) {
    Lease l = bal.acquire(r);
    if (filled != nullptr) *filled = l && l.needs_fill();
    if (l && l.needs_fill()) {
      if (!files::fill_from_file(r.data, r.bytes, l.data(), 1, l.shared_fill()))
        std::memcpy(l.data(), r.data, r.bytes);
      l.filled();
    }
    std::vector<char> out(r.bytes);
    std::memcpy(out.data(), l ? l.data() : r.data, r.bytes);
    return out;
  }

  // The segment files in a share directory.
  static size_t segments_in(const std::string& dir) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(dir)) return 0;
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind("seg-", 0) == 0;
    return n;
  }

  std::string name_, root_, dir_, path_;
  std::shared_ptr<files::MappedFile> file_;
};

}  // namespace pins
