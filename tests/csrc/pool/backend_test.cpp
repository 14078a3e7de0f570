// Note [Host backend contract] (csrc/pool/backend.h), checked on each backend
// this build has. A backend or a call it cannot make here is skipped with the
// reason: the hip backend without an AMD GPU runs its mmap layer (reserve,
// release, commit, decommit) and skips lock and unlock.
#include "csrc/pool/backend.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/pool/backend_testing.h"

namespace pins {
namespace {

struct BackendCase {
  std::string name;
  std::function<std::unique_ptr<HostBackend>()> make;
  // Why make() may give nothing here; empty when it must give a backend.
  std::string absent;
  // Why lock() cannot be tested here although the backend exists; empty when it can.
  std::function<std::string()> lock_untestable;
};

// Test names and ctest's list show the backend, not the struct's bytes.
void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

// The lock tests lock 16 pages at most; root may lock past the limit.
std::string mlock_untestable() {
  rlimit r{};
  if (geteuid() == 0 || getrlimit(RLIMIT_MEMLOCK, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return "";
  const auto needed = static_cast<rlim_t>(16 * sysconf(_SC_PAGESIZE));
  return r.rlim_cur < needed ? "mlock refused here (RLIMIT_MEMLOCK below 16 pages)" : "";
}

std::string no_reason() { return ""; }

std::vector<BackendCase> cases() {
  return {
      {"cpu", [] { return make_cpu_backend(false); }, "", no_reason},
      {"mlock", [] { return make_cpu_backend(true); }, "", mlock_untestable},
      {"null", make_null_backend, "", no_reason},
      {"cuda", make_cuda_backend, "no CUDA device (or pins built without CUDA)", no_reason},
      {"hip", testing::hip_backend_without_device_check, kBuiltWithHip ? "" : "pins built without HIP (PINS_WITH_HIP)",
       [] { return make_hip_backend() ? std::string() : std::string("no HIP device"); }},
  };
}

class HostBackendContract : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    if (backend_ == nullptr) {
      ASSERT_FALSE(GetParam().absent.empty()) << GetParam().name << " backend: built in, yet not made";
      GTEST_SKIP() << GetParam().absent;
    }
    page_ = backend_->page_size();
    ASSERT_EQ(backend_->reserve(kPages * page_, &base_), 0);
  }
  void TearDown() override {
    if (base_ != nullptr) {
      EXPECT_EQ(backend_->release(base_, kPages * page_), 0);
    }
  }
  // Skips the test when this backend cannot page-lock here, saying why.
  bool lock_untestable() {
    if (!backend_->can_lock()) {
      reason_ = GetParam().name + " backend does not lock (can_lock() is false)";
    } else {
      reason_ = GetParam().lock_untestable();
    }
    return !reason_.empty();
  }
  char* at(size_t page) const { return static_cast<char*>(base_) + page * page_; }
  void fill(size_t page, size_t pages, char c) {
    if (backend_->holds_bytes()) std::memset(at(page), c, pages * page_);
  }
  // Whether every byte of the pages reads `c` (trivially so without bytes).
  bool reads(size_t page, size_t pages, char c) const {
    if (!backend_->holds_bytes()) return true;
    for (size_t i = 0; i < pages * page_; ++i)
      if (at(page)[i] != c) return false;
    return true;
  }

  static constexpr size_t kPages = 64;
  std::unique_ptr<HostBackend> backend_;
  size_t page_ = 0;
  void* base_ = nullptr;
  std::string reason_;
};

TEST_P(HostBackendContract, ReserveGivesPageAlignedAddressSpace) {
  EXPECT_STREQ(backend_->name(), GetParam().name == "mlock" ? "cpu" : GetParam().name.c_str());
  EXPECT_GT(page_, 0u);
  EXPECT_EQ(page_ & (page_ - 1), 0u) << "page size " << page_ << " is not a power of two";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base_) % page_, 0u);
  void* other = nullptr;
  ASSERT_EQ(backend_->reserve(kPages * page_, &other), 0);
  EXPECT_NE(other, base_) << "two reservations overlap";
  EXPECT_EQ(backend_->release(other, kPages * page_), 0);
}

TEST_P(HostBackendContract, CommitBacksARangeWithBytes) {
  ASSERT_EQ(backend_->commit(at(4), 8 * page_), 0);
  fill(4, 8, 'x');
  EXPECT_TRUE(reads(4, 8, 'x'));
  EXPECT_EQ(backend_->decommit(at(4), 8 * page_), 0);
}

TEST_P(HostBackendContract, ADecommittedRangeReadsZerosWhenCommittedAgain) {
  ASSERT_EQ(backend_->commit(at(0), 16 * page_), 0);
  fill(0, 16, 'x');
  ASSERT_EQ(backend_->decommit(at(2), 4 * page_), 0);  // part of a committed range
  ASSERT_EQ(backend_->commit(at(2), 4 * page_), 0);
  EXPECT_TRUE(reads(2, 4, '\0'));
  EXPECT_TRUE(reads(0, 2, 'x')) << "decommit reached before its range";
  EXPECT_TRUE(reads(6, 10, 'x')) << "decommit reached past its range";
  EXPECT_EQ(backend_->decommit(at(0), 16 * page_), 0);
}

TEST_P(HostBackendContract, ALockedRangeKeepsItsBytesAndUnlocksAsLocked) {
  if (lock_untestable()) GTEST_SKIP() << reason_;
  ASSERT_EQ(backend_->commit(at(0), 8 * page_), 0);
  fill(0, 8, 'x');
  ASSERT_EQ(backend_->lock(at(0), 8 * page_), 0);
  EXPECT_TRUE(reads(0, 8, 'x'));
  fill(0, 8, 'y');
  EXPECT_EQ(backend_->unlock(at(0), 8 * page_), 0);
  EXPECT_TRUE(reads(0, 8, 'y'));
  EXPECT_EQ(backend_->decommit(at(0), 8 * page_), 0);
}

TEST_P(HostBackendContract, TwoRangesLockAndUnlockApart) {
  if (lock_untestable()) GTEST_SKIP() << reason_;
  ASSERT_EQ(backend_->commit(at(0), 16 * page_), 0);
  ASSERT_EQ(backend_->lock(at(0), 8 * page_), 0);
  ASSERT_EQ(backend_->lock(at(8), 8 * page_), 0);
  EXPECT_EQ(backend_->unlock(at(0), 8 * page_), 0);
  EXPECT_EQ(backend_->decommit(at(0), 8 * page_), 0) << "an unlocked range beside a locked one";
  EXPECT_EQ(backend_->unlock(at(8), 8 * page_), 0);
  EXPECT_EQ(backend_->decommit(at(8), 8 * page_), 0);
}

// Prewarmed extents are joined and cut (Note [Host pool layout]): the pool
// decommits in one call what it committed in two, and locks part of one.
TEST_P(HostBackendContract, DecommitAndLockNeedNotFollowTheCommits) {
  ASSERT_EQ(backend_->commit(at(0), 8 * page_), 0);
  ASSERT_EQ(backend_->commit(at(8), 8 * page_), 0);
  fill(0, 16, 'x');
  ASSERT_EQ(backend_->decommit(at(4), 8 * page_), 0) << "across two commits";
  ASSERT_EQ(backend_->commit(at(4), 8 * page_), 0);
  EXPECT_TRUE(reads(4, 8, '\0'));
  EXPECT_TRUE(reads(0, 4, 'x'));
  EXPECT_TRUE(reads(12, 4, 'x'));
  if (!lock_untestable()) {
    ASSERT_EQ(backend_->lock(at(2), 4 * page_), 0) << "part of a commit";
    EXPECT_EQ(backend_->unlock(at(2), 4 * page_), 0);
  }
  EXPECT_EQ(backend_->decommit(at(0), 16 * page_), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, HostBackendContract, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BackendCase>& info) { return info.param.name; });

// A device backend the configuration asks for and this build or machine lacks
// is refused, naming the backend and which of the two lacks it.
TEST(HostBackendChoice, AnAbsentDeviceBackendIsRefusedSayingWhy) {
  struct Case {
    BackendKind kind;
    std::unique_ptr<HostBackend> (*make)();
    const char* name;
    std::string why;
  } device_backends[] = {
      {BackendKind::Cuda, make_cuda_backend, "cuda",
       kBuiltWithCuda ? "no CUDA device is present" : "pins was built without CUDA"},
      {BackendKind::Hip, make_hip_backend, "hip",
       kBuiltWithHip ? "no HIP device is present" : "pins was built without HIP"},
  };
  for (const Case& c : device_backends) {
    if (c.make() != nullptr) continue;
    try {
      make_backend(c.kind, false);
      ADD_FAILURE() << "backend:" << c.name << " was made, yet make_" << c.name << "_backend() gives none";
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("PINS_CONF backend:") + c.name + " was asked for"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.why), std::string::npos) << msg;
    }
  }
}

TEST(HostBackendChoice, AutoTakesCudaThenHipThenCpu) {
  const char* want = make_cuda_backend() ? "cuda" : make_hip_backend() ? "hip" : "cpu";
  EXPECT_STREQ(make_backend(BackendKind::Auto, false)->name(), want);
}

}  // namespace
}  // namespace pins
