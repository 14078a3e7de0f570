// Note [Shared pins] where the host breaks it (issue 38): a tmpfs too full
// for the index, a peer stopped while it holds the index lock, a file
// rewritten in place after a peer filled its segment, a share directory that
// cannot be used, a share_dir on disk. Runtimes in this process play processes
// (each attaches with its own open file description, so its own slot); a
// stopped peer is an OFD lock on the index taken by the test itself. Each test
// is a reproduction through the runtime and the balancer's public calls.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/files/mapped.h"
#include "csrc/runtime/runtime.h"
#include "csrc/share/host_share.h"
#include "tests/csrc/share/chaos_pattern.h"
#include "tests/csrc/share/share_file_test.h"

namespace pins {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

class ShareRobustness : public ShareFileTest {
 protected:
  ShareRobustness() : ShareFileTest("pins-share-rob") {}
  std::unique_ptr<Runtime> runtime(const std::string& share_dir) const { return runtime_in(share_dir, true); }
  static std::vector<char> cast(Balancer& bal, const Request& r) { return cast_bytes(bal, r); }
  static bool is_pattern(const std::vector<char>& got, uint64_t layer) {
    return testing::first_wrong_byte(got.data(), layer * kLayer, got.size()) == got.size();
  }
  size_t segments(const std::string& dir) const { return segments_in(dir); }
};

// A tmpfs of the test's own (read-only with MS_RDONLY), unmounted when it
// ends; skipped where mount is not allowed (it needs root).
class SmallTmpfs {
 public:
  SmallTmpfs(const std::string& path, const char* size, unsigned long flags = 0) : path_(path) {
    fs::create_directories(path);
    const std::string opts = std::string("size=") + size + ",mode=0700";
    mounted_ = mount("tmpfs", path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | flags, opts.c_str()) == 0;
    if (!mounted_) why_ = std::strerror(errno);
  }
  ~SmallTmpfs() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  std::string path_, why_;
  bool mounted_ = false;
};

// 1. A tmpfs with less room than the index (1 MiB against 2 MiB): the first
// cast with share:true used to die of SIGBUS and leave the index behind.
TEST_F(ShareRobustness, ATmpfsTooFullForTheIndexIsNoSignalAndLeavesNothing) {
  const std::string small = root_ + "/small";
  SmallTmpfs tmpfs(small, "1m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << tmpfs.why();
  const pid_t child = fork();
  if (child == 0) {
    alarm(20);
    try {
      auto rt = runtime(small);
      const ModelId m = rt->balancer().register_model("m", "cpu");
      for (uint64_t l = 0; l < kLayers; ++l)
        if (!is_pattern(cast(rt->balancer(), request(m, l)), l)) _exit(2);
      if (rt->share_state().shared || rt->share_state().reason != std::string("space")) _exit(5);
      _exit(rt->pool().stats().committed_bytes.current > 0 ? 0 : 3);  // pinned privately
    } catch (...) {
      _exit(4);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: a wrong byte, 3: nothing pinned, 4: an exception, 5: share_state not "
                                        "'space'";
  EXPECT_TRUE(fs::is_empty(small)) << "left in the tmpfs: " << fs::directory_iterator(small)->path();
}

// 2. A peer stopped while it holds the index lock (here: the lock taken by the
// test and never let go) used to block every cast, stats() and a new attach
// until it ran again. Each now waits one bound at most and pins privately.
TEST_F(ShareRobustness, AStoppedLockHolderDelaysACastByOneBoundAtMost) {
  auto a = runtime(root_);
  ASSERT_NE(a->share(), nullptr);
  const ModelId m = a->balancer().register_model("m", "cpu");
  ASSERT_TRUE(is_pattern(cast(a->balancer(), request(m, 0)), 0));
  const int held = ::open((dir_ + "/index").c_str(), O_RDWR);
  ASSERT_GE(held, 0);
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 1;
  ASSERT_EQ(fcntl(held, F_OFD_SETLK, &fl), 0);
  const auto timed = [](auto f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto work = std::async(std::launch::async, [&] {
    std::vector<double> s;
    bool right = true;
    s.push_back(timed([&] { right = right && is_pattern(cast(a->balancer(), request(m, 1)), 1); }));
    s.push_back(timed([&] { right = right && is_pattern(cast(a->balancer(), request(m, 2)), 2); }));
    s.push_back(timed([&] { (void)a->share()->stats(); }));
    std::string reason = "attached";
    s.push_back(timed([&] { reason = runtime(root_)->share_state().reason; }));
    s.push_back(right ? 1.0 : 0.0);
    s.push_back(reason == "lock" ? 1.0 : 0.0);
    return s;
  });
  const bool done = work.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  fl.l_type = F_UNLCK;
  fcntl(held, F_OFD_SETLK, &fl);  // the peer runs again
  ::close(held);
  ASSERT_TRUE(done) << "a cast, stats() or an attach waited 20 s for a stopped peer";
  const std::vector<double> s = work.get();
  EXPECT_EQ(s[4], 1.0) << "a wrong byte";
  EXPECT_LT(s[0], 5.0) << "the first cast waited " << s[0] << " s";
  EXPECT_LT(s[1], 0.5) << "the second cast waited " << s[1] << " s: it should try once";
  EXPECT_LT(s[2], 5.0) << "stats() waited " << s[2] << " s";
  EXPECT_LT(s[3], 5.0) << "a new attach waited " << s[3] << " s";
  EXPECT_EQ(s[5], 1.0) << "the new process's share_state is not 'lock'";
  EXPECT_GT(a->pool().stats().committed_bytes.current, 0) << "the casts meanwhile were pinned privately";
  // Once the peer lets go, pins are shared again.
  const uint64_t fills = a->share()->stats().fills;
  ASSERT_TRUE(is_pattern(cast(a->balancer(), request(m, 3)), 3));
  EXPECT_EQ(a->share()->stats().fills, fills + 1);
}

// 3. A file rewritten in place (same path, same inode) after a peer filled its
// segment: a process that mapped it before used to join that segment and
// serve the old bytes. It serves what it would without sharing: the file's
// bytes now.
TEST_F(ShareRobustness, AFileRewrittenInPlaceIsNotJoinedFromBeforeTheRewrite) {
  auto a = runtime(root_), b = runtime(root_);
  const ModelId ma = a->balancer().register_model("m", "cpu"), mb = b->balancer().register_model("m", "cpu");
  ASSERT_TRUE(is_pattern(cast(a->balancer(), request(ma, 0)), 0));
  ASSERT_EQ(segments(dir_), 1u);
  // Rewritten in place: every byte flipped, the mtime a second on (the
  // kernel's clock may not tick between two writes).
  std::vector<char> now(kLayer);
  testing::chaos_fill(now.data(), 0, kLayer);
  for (char& c : now) c = static_cast<char>(~c);
  const int fd = ::open(path_.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, now.data(), now.size(), 0), static_cast<ssize_t>(now.size()));
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  times[1].tv_sec += 1;
  ASSERT_EQ(futimens(fd, times), 0);
  ::close(fd);
  const std::vector<char> got = cast(b->balancer(), request(mb, 0));
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != now[i];
  EXPECT_EQ(differ, 0u) << "bytes of the file before its rewrite were served";
}

// 4. A share directory that cannot be used (missing, a file, open to others, a
// symlink) used to make every pins call raise. The process pins privately.
TEST_F(ShareRobustness, AProcessThatCannotUseTheShareDirectoryPinsPrivately) {
  const std::string file_root = root_ + "/a-file";
  std::fclose(std::fopen(file_root.c_str(), "w"));
  const std::string open_root = root_ + "/open", link_root = root_ + "/link";
  fs::create_directories(open_root + "/pins-" + std::to_string(geteuid()));
  chmod((open_root + "/pins-" + std::to_string(geteuid())).c_str(), 0755);
  fs::create_directories(link_root);
  fs::create_directory_symlink(root_, link_root + "/pins-" + std::to_string(geteuid()));
  const std::pair<std::string, const char*> cases[] = {
      {root_ + "/missing", "directory"}, {file_root, "directory"}, {open_root, "owner"}, {link_root, "owner"}};
  for (const auto& [where, reason] : cases) {
    SCOPED_TRACE(where);
    std::unique_ptr<Runtime> rt;
    ASSERT_NO_THROW(rt = runtime(where));
    EXPECT_EQ(rt->share(), nullptr);
    EXPECT_FALSE(rt->share_state().shared);
    EXPECT_EQ(rt->share_state().reason, reason) << rt->share_state().message;
    const ModelId m = rt->balancer().register_model("m", "cpu");
    EXPECT_TRUE(is_pattern(cast(rt->balancer(), request(m, 1)), 1));
    EXPECT_GT(rt->pool().stats().committed_bytes.current, 0) << "no private pin";
  }
  EXPECT_FALSE(fs::exists(root_ + "/missing"));
}

// 4. A read-only share_dir (a read-only mount: root writes through a 0500
// directory) used to make every pins call raise.
TEST_F(ShareRobustness, AReadOnlyShareDirPinsPrivately) {
  const std::string ro = root_ + "/ro";
  SmallTmpfs tmpfs(ro, "1m", MS_RDONLY);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << tmpfs.why();
  std::unique_ptr<Runtime> rt;
  ASSERT_NO_THROW(rt = runtime(ro));
  EXPECT_EQ(rt->share(), nullptr);
  EXPECT_EQ(rt->share_state().reason, "directory") << rt->share_state().message;
  EXPECT_NE(rt->share_state().message.find("Read-only"), std::string::npos) << rt->share_state().message;
  const ModelId m = rt->balancer().register_model("m", "cpu");
  EXPECT_TRUE(is_pattern(cast(rt->balancer(), request(m, 2)), 2));
  EXPECT_GT(rt->pool().stats().committed_bytes.current, 0) << "no private pin";
}

// 4. The 65th process of a host used to be refused a slot.
TEST_F(ShareRobustness, MoreThanSixtyFourProcessesShare) {
  share::ShareOptions o;
  o.root = root_;
  std::vector<std::shared_ptr<share::HostShare>> attached;
  for (int i = 0; i < 100; ++i) ASSERT_NO_THROW(attached.push_back(share::HostShare::attach(o))) << i;
  EXPECT_EQ(attached.back()->stats().processes, 100u);
}

// 4. The process past the last slot (256 attached) used to raise at every
// call, with a message saying it pinned privately: now it does.
TEST_F(ShareRobustness, AProcessPastTheLastSlotPinsPrivately) {
  share::ShareOptions o;
  o.root = root_;
  std::vector<std::shared_ptr<share::HostShare>> attached;
  for (;;) {
    try {
      attached.push_back(share::HostShare::attach(o));
    } catch (const share::AttachError& e) {
      ASSERT_STREQ(e.reason, "slots") << e.what();
      break;
    }
    ASSERT_LE(attached.size(), 4096u) << "no ceiling";
  }
  ASSERT_GE(attached.size(), 256u) << "fewer slots than 256";
  std::unique_ptr<Runtime> rt;
  ASSERT_NO_THROW(rt = runtime(root_));
  EXPECT_EQ(rt->share(), nullptr);
  EXPECT_EQ(rt->share_state().reason, "slots") << rt->share_state().message;
  EXPECT_EQ(rt->share_state().message.find("share:false"), std::string::npos) << rt->share_state().message;
  const ModelId m = rt->balancer().register_model("m", "cpu");
  EXPECT_TRUE(is_pattern(cast(rt->balancer(), request(m, 3)), 3));
  EXPECT_GT(rt->pool().stats().committed_bytes.current, 0) << "no private pin";
  attached.pop_back();  // a slot is free again: the next process shares
  EXPECT_NE(runtime(root_)->share(), nullptr);
}

// A share_dir on disk used to be taken silently (segments written to disk).
TEST_F(ShareRobustness, AShareDirNotInRamIsRefusedWithAClearMessage) {
  std::string disk = fs::current_path().string() + "/pins-share-disk-XXXXXX";
  ASSERT_NE(mkdtemp(disk.data()), nullptr);
  struct statfs f {};
  ASSERT_EQ(statfs(disk.c_str(), &f), 0);
  if (f.f_type == 0x01021994 || f.f_type == static_cast<decltype(f.f_type)>(0x858458f6)) {
    fs::remove_all(disk);
    GTEST_SKIP() << fs::current_path() << " is in RAM here: no disk to try";
  }
  share::ShareOptions o;
  o.root = disk;
  std::string what = "attached";
  try {
    share::HostShare::attach(o);
  } catch (const ResourceError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("not tmpfs"), std::string::npos) << what;
  EXPECT_NE(what.find(disk), std::string::npos) << what;
  // Through the runtime: it pins privately and says why, writing nothing there.
  {
    auto rt = runtime(disk);
    EXPECT_EQ(rt->share(), nullptr);
    EXPECT_EQ(rt->share_state().reason, "filesystem") << rt->share_state().message;
    const ModelId m = rt->balancer().register_model("m", "cpu");
    EXPECT_TRUE(is_pattern(cast(rt->balancer(), request(m, 0)), 0));
  }
  EXPECT_TRUE(fs::is_empty(disk)) << "made on disk: " << fs::directory_iterator(disk)->path();
  fs::remove_all(disk);
}

}  // namespace
}  // namespace pins
