// Note [Shared pins]: the host index, its segments, leases, liveness, checks
// and security. Processes are played by HostShare instances in this process
// (each has its own open file description, hence its own slot) and by fork()
// children.
#include "csrc/share/host_share.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/share/index_linux.h"
#include "csrc/share/share_testing.h"

namespace pins::share {
namespace {

namespace fs = std::filesystem;

// A share root of the test's own, under /dev/shm where there is one.
class HostShareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string base = fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string tmpl = base + "/pins-share-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    opts_.root = root_;
    opts_.wait_ms = 100;
    dir_ = root_ + "/pins-" + std::to_string(geteuid());
  }
  void TearDown() override { fs::remove_all(root_); }

  // The segment files in the share directory now.
  std::set<std::string> segments() const {
    std::set<std::string> out;
    if (!fs::is_directory(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().rfind("seg-", 0) == 0) out.insert(e.path().filename().string());
    return out;
  }

  static Key key(uint64_t offset, uint64_t length = 8192) {
    Key k;
    k.dev = 1;
    k.ino = 42;
    k.size = 1 << 20;
    k.mtime_ns = 7;
    k.ctime_ns = 8;
    k.offset = offset;
    k.length = length;
    return k;
  }

  static void fill(const Grant& g, char c) { std::memset(g.data, c, g.length); }
  static bool holds(const Grant& g, char c) {
    const auto* p = static_cast<const char*>(g.data);
    for (uint64_t i = 0; i < g.length; ++i)
      if (p[i] != c) return false;
    return true;
  }
  static void release(HostShare& s, const Grant& g) { s.release(g.entry, g.generation, g.data, g.length); }

  std::string root_, dir_;
  ShareOptions opts_;
};

TEST_F(HostShareTest, SecondProcessJoinsWhatTheFirstFilled) {
  auto a = HostShare::attach(opts_);
  auto b = HostShare::attach(opts_);
  EXPECT_EQ(a->stats().processes, 2u);
  const Grant w = a->acquire(key(0));
  ASSERT_EQ(w.kind, Grant::Kind::Write);
  fill(w, 'x');
  // Not published: b waits for it, then gives up (opts_.wait_ms) and copies from its source.
  EXPECT_EQ(b->acquire(key(0)).kind, Grant::Kind::None);
  EXPECT_EQ(b->stats().waits, 1u);
  EXPECT_EQ(b->stats().busy, 1u);
  ASSERT_TRUE(a->publish(w));
  const Grant r = b->acquire(key(0));
  ASSERT_EQ(r.kind, Grant::Kind::Ready);
  EXPECT_NE(r.data, w.data) << "b's own mapping";
  EXPECT_TRUE(holds(r, 'x'));
  EXPECT_EQ(b->stats().joins, 1u);
  const ShareStats s = a->stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, 8192u) << "each segment counted once";
  EXPECT_EQ(segments().size(), 1u);
  // a's lease goes, b's keeps the segment; b's goes, the segment goes.
  release(*a, w);
  EXPECT_EQ(segments().size(), 1u);
  EXPECT_TRUE(holds(r, 'x'));
  release(*b, r);
  EXPECT_TRUE(segments().empty());
  EXPECT_EQ(a->stats().entries, 0u);
}

TEST_F(HostShareTest, WaiterGetsTheSegmentOnceItsWriterPublishes) {
  auto a = HostShare::attach(opts_);
  ShareOptions patient = opts_;
  patient.wait_ms = 10000;
  auto b = HostShare::attach(patient);
  const Grant w = a->acquire(key(4096));
  ASSERT_EQ(w.kind, Grant::Kind::Write);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    fill(w, 'q');
    a->publish(w);
  });
  const Grant r = b->acquire(key(4096));
  writer.join();
  ASSERT_EQ(r.kind, Grant::Kind::Ready);
  EXPECT_TRUE(holds(r, 'q'));
  EXPECT_EQ(b->stats().waits, 1u);
  release(*b, r);
  release(*a, w);
}

TEST_F(HostShareTest, UnpublishedWriteIsDroppedOnRelease) {
  auto a = HostShare::attach(opts_);
  auto b = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  ASSERT_EQ(w.kind, Grant::Kind::Write);
  release(*a, w);  // a fill that failed: never Ready
  EXPECT_TRUE(segments().empty());
  const Grant w2 = b->acquire(key(0));
  EXPECT_EQ(w2.kind, Grant::Kind::Write) << "b fills it afresh";
  EXPECT_NE(w2.generation, w.generation);
  release(*b, w2);
}

TEST_F(HostShareTest, DifferentKeysAreDifferentSegments) {
  auto a = HostShare::attach(opts_);
  Key changed = key(0);
  changed.mtime_ns++;  // the file was written since: another key
  const Grant g1 = a->acquire(key(0)), g2 = a->acquire(changed), g3 = a->acquire(key(8192));
  ASSERT_EQ(g1.kind, Grant::Kind::Write);
  ASSERT_EQ(g2.kind, Grant::Kind::Write);
  ASSERT_EQ(g3.kind, Grant::Kind::Write);
  EXPECT_EQ(segments().size(), 3u);
  for (const Grant* g : {&g1, &g2, &g3}) release(*a, *g);
}

TEST_F(HostShareTest, BadKeysGetNoGrant) {
  auto a = HostShare::attach(opts_);
  EXPECT_EQ(a->acquire(key(0, 0)).kind, Grant::Kind::None);
  EXPECT_EQ(a->acquire(key(1 << 20, 1)).kind, Grant::Kind::None);
  Key past = key(0);
  past.length = past.size + 1;
  EXPECT_EQ(a->acquire(past).kind, Grant::Kind::None);
  EXPECT_TRUE(segments().empty());
}

TEST_F(HostShareTest, LastDetachRemovesEverything) {
  auto a = HostShare::attach(opts_);
  auto b = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  ASSERT_TRUE(a->publish(w));
  const Grant r = b->acquire(key(0));
  ASSERT_EQ(r.kind, Grant::Kind::Ready);
  a->detach();
  EXPECT_TRUE(fs::exists(dir_ + "/index"));
  EXPECT_EQ(segments().size(), 1u) << "b leases it";
  EXPECT_TRUE(holds(r, 0)) << "a's detach leaves b's mapping";
  b->detach();
  EXPECT_FALSE(fs::exists(dir_)) << "the last one out removes the directory";
  // Leases released after detach only unmap.
  release(*a, w);
  release(*b, r);
  // A new attach starts afresh.
  auto c = HostShare::attach(opts_);
  EXPECT_EQ(c->acquire(key(0)).kind, Grant::Kind::Write);
}

TEST_F(HostShareTest, FullProbeIsRefusedNotACrash) {
  // Keys whose probes start at one place: the probe's bound (512) fills, the
  // next such key is refused, and every other key still gets its entry.
  auto a = HostShare::attach(opts_);
  const auto big = [](uint64_t off) {
    Key k = key(0, 4096);
    k.size = uint64_t{1} << 40;
    k.offset = off;
    return k;
  };
  const uint64_t target = key_hash(big(0)) & 16383;
  std::vector<Grant> held;
  uint64_t off = 0;
  const auto next_colliding = [&] {
    for (;; off += 4096) {
      const Key k = big(off);
      if ((key_hash(k) & 16383) == target) {
        off += 4096;
        return k;
      }
    }
  };
  while (held.size() < 512) {
    const Grant g = a->acquire(next_colliding());
    ASSERT_EQ(g.kind, Grant::Kind::Write) << held.size();
    held.push_back(g);
  }
  EXPECT_EQ(a->acquire(next_colliding()).kind, Grant::Kind::None);
  EXPECT_EQ(a->stats().refused, 1u);
  const Grant other = a->acquire(key(0));
  EXPECT_EQ(other.kind, Grant::Kind::Write);
  release(*a, other);
  for (const Grant& g : held) release(*a, g);
  EXPECT_TRUE(segments().empty());
}

TEST_F(HostShareTest, SegmentRemovedByHandIsDroppedNotServed) {
  auto a = HostShare::attach(opts_);
  auto b = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  fill(w, 'k');
  ASSERT_TRUE(a->publish(w));
  for (const std::string& s : segments()) fs::remove(dir_ + "/" + s);
  EXPECT_EQ(b->acquire(key(0)).kind, Grant::Kind::None);
  EXPECT_EQ(b->stats().errors, 1u);
  EXPECT_EQ(b->stats().entries, 0u) << "the entry went with its file";
  const Grant again = b->acquire(key(0));
  EXPECT_EQ(again.kind, Grant::Kind::Write);
  EXPECT_TRUE(holds(w, 'k')) << "a's mapping still holds its bytes";
  release(*a, w);
  release(*b, again);
  EXPECT_TRUE(segments().empty());
}

// ---- a peer writing garbage, a process killed in an update

// The index file's entries, as a peer sees them.
struct RawIndex {
  explicit RawIndex(const std::string& path) {
    fd = ::open(path.c_str(), O_RDWR);
    size = static_cast<size_t>(lseek(fd, 0, SEEK_END));
    base = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  }
  ~RawIndex() {
    munmap(base, size);
    ::close(fd);
  }
  char* entry(uint32_t i) { return base + 4096 + size_t{i} * 128; }
  int fd;
  size_t size;
  char* base;
};

TEST_F(HostShareTest, TornEntryIsDroppedAndItsSegmentRemoved) {
  auto a = HostShare::attach(opts_);
  auto b = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  fill(w, 'x');
  ASSERT_TRUE(a->publish(w));
  {
    RawIndex raw(dir_ + "/index");
    raw.entry(w.entry)[40] ^= 0x5a;  // one byte of the key flipped, its checksum not
  }
  // b does not trust it: the entry goes, a fresh one is filled.
  const Grant g = b->acquire(key(0));
  EXPECT_EQ(g.kind, Grant::Kind::Write);
  EXPECT_EQ(b->stats().torn, 1u);
  EXPECT_EQ(segments().size(), 1u) << "the torn entry's segment is gone, the new one is there";
  EXPECT_TRUE(holds(w, 'x')) << "a's mapping still serves its bytes";
  release(*a, w);  // its entry is gone: only unmapped
  release(*b, g);
  EXPECT_TRUE(segments().empty());
}

TEST_F(HostShareTest, GarbageEverywhereIsNeverTrusted) {
  auto a = HostShare::attach(opts_);
  std::vector<Grant> held;
  for (int i = 0; i < 8; ++i) {
    Grant g = a->acquire(key(uint64_t(i) * 8192));
    fill(g, static_cast<char>('a' + i));
    a->publish(g);
    held.push_back(g);
  }
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  std::printf("GarbageEverywhereIsNeverTrusted seed=%u\n", seed);
  std::srand(seed);
  {
    RawIndex raw(dir_ + "/index");
    for (size_t i = 4096; i < raw.size; i += 1 + std::rand() % 4000) raw.base[i] = static_cast<char>(std::rand());
  }
  auto b = HostShare::attach(opts_);
  for (int i = 0; i < 8; ++i) {
    const Grant g = b->acquire(key(uint64_t(i) * 8192));
    ASSERT_NE(g.kind, Grant::Kind::None);
    // Either the entry survived whole (then it holds a's bytes) or b fills it.
    if (g.kind == Grant::Kind::Ready) EXPECT_TRUE(holds(g, static_cast<char>('a' + i)));
    release(*b, g);
  }
  {
    RawIndex raw(dir_ + "/index");
    std::memset(raw.base, 0xff, 64);  // the header itself
  }
  auto c = HostShare::attach(opts_);  // rebuilds the index
  EXPECT_EQ(c->stats().entries, 0u);
  EXPECT_TRUE(segments().empty());
  for (const Grant& g : held) EXPECT_TRUE(holds(g, static_cast<char>('a' + (&g - held.data()))));
  for (const Grant& g : held) release(*a, g);
}

// ---- processes that die

// Runs `child` in a fork child and returns its pid; `child` ends it.
template <typename F>
pid_t spawn(F child) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    child();
    _exit(0);
  }
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST_F(HostShareTest, DeadWritersEntryIsTakenOver) {
  auto a = HostShare::attach(opts_);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = spawn([&] {
    auto c = HostShare::attach(opts_);
    const Grant g = c->acquire(key(0));
    (void)!write(ready[1], g.kind == Grant::Kind::Write ? "w" : "n", 1);
    pause();  // killed mid-fill
  });
  char got = 0;
  ASSERT_EQ(read(ready[0], &got, 1), 1);
  ASSERT_EQ(got, 'w');
  EXPECT_EQ(a->stats().processes, 2u);
  kill(child, SIGKILL);
  wait_for(child);
  const Grant g = a->acquire(key(0));
  EXPECT_EQ(g.kind, Grant::Kind::Write) << "the dead writer's entry was dropped";
  EXPECT_GE(a->stats().dead_slots, 1u);
  EXPECT_EQ(segments().size(), 1u);
  release(*a, g);
  close(ready[0]);
  close(ready[1]);
}

TEST_F(HostShareTest, DeadReadersLeasesGoAndTheLastExitCleansUp) {
  auto a = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  fill(w, 'z');
  ASSERT_TRUE(a->publish(w));
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = spawn([&] {
    auto c = HostShare::attach(opts_);
    const Grant g = c->acquire(key(0));
    const bool ok = g.kind == Grant::Kind::Ready && holds(g, 'z');
    (void)!write(ready[1], ok ? "r" : "n", 1);
    pause();
  });
  char got = 0;
  ASSERT_EQ(read(ready[0], &got, 1), 1);
  ASSERT_EQ(got, 'r');
  kill(child, SIGKILL);
  wait_for(child);
  release(*a, w);  // the child's bit is still set: the entry stays until a sweep sees it dead
  a->detach();     // the sweep: the dead lease goes, and a is the last one out
  EXPECT_FALSE(fs::exists(dir_));
  close(ready[0]);
  close(ready[1]);
}

TEST_F(HostShareTest, KilledLastProcessIsCleanedUpByTheNext) {
  const pid_t child = spawn([&] {
    auto c = HostShare::attach(opts_);
    const Grant g = c->acquire(key(0));
    c->publish(g);
    kill(getpid(), SIGKILL);
  });
  wait_for(child);
  EXPECT_EQ(segments().size(), 1u) << "left behind by the kill";
  auto a = HostShare::attach(opts_);
  EXPECT_TRUE(segments().empty());
  EXPECT_EQ(a->stats().entries, 0u);
  EXPECT_EQ(a->stats().processes, 1u);
}

TEST_F(HostShareTest, ForkChildDoesNotShareItsParentsSlot) {
  auto a = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  a->publish(w);
  const pid_t child = spawn([&] {
    // The parent's instance in the child: no grants, no index writes.
    if (a->acquire(key(8192)).kind != Grant::Kind::None) _exit(1);
    a->detach();
    _exit(0);
  });
  const int status = wait_for(child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(segments().size(), 1u) << "the child's detach left the parent's index alone";
  auto b = HostShare::attach(opts_);
  EXPECT_EQ(b->acquire(key(0)).kind, Grant::Kind::Ready);
}

// ---- security

TEST_F(HostShareTest, DirectoryOpenToOthersIsRefused) {
  ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0);
  try {
    HostShare::attach(opts_);
    FAIL() << "a directory open to others was accepted";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("mode 755"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir_), std::string::npos) << e.what();
  }
}

TEST_F(HostShareTest, FilesAreTheUsersOwnAndPrivate) {
  auto a = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  struct stat st {};
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir_ + "/index").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  for (const std::string& s : segments()) {
    ASSERT_EQ(stat((dir_ + "/" + s).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_uid, geteuid());
  }
  release(*a, w);
}

TEST_F(HostShareTest, AnotherUsersProcessCannotAttach) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as another uid";
  auto a = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  a->publish(w);
  ASSERT_EQ(chmod(root_.c_str(), 01777), 0);  // the root is open to all, as /dev/shm is; the share directory is not
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = spawn([&] {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    // As uid 65534 the directory is <root>/pins-65534; a link to root's one
    // is what an attacker would try.
    const std::string mine = root_ + "/pins-65534";
    std::string what = "attached";
    if (symlink(dir_.c_str(), mine.c_str()) != 0) what = "no-symlink";
    try {
      HostShare::attach(opts_);
    } catch (const std::exception& e) {
      what = e.what();
    }
    // And the index itself, straight.
    const int fd = ::open((dir_ + "/index").c_str(), O_RDONLY);
    if (fd >= 0) what += " | index readable";
    (void)!write(out[1], what.data(), what.size());
    _exit(0);
  });
  wait_for(child);
  close(out[1]);
  char buf[1024] = {};
  const ssize_t n = read(out[0], buf, sizeof buf - 1);
  close(out[0]);
  const std::string what(buf, n > 0 ? static_cast<size_t>(n) : 0);
  EXPECT_EQ(what.find("attached"), std::string::npos) << what;
  EXPECT_EQ(what.find("index readable"), std::string::npos) << what;
  EXPECT_NE(what.find("share: "), std::string::npos) << what;
  // The owner's segment is untouched.
  EXPECT_EQ(a->stats().entries, 1u);
  release(*a, w);
}

TEST_F(HostShareTest, DirectoryOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a directory another uid owns";
  ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
  ASSERT_EQ(chown(dir_.c_str(), 65534, 65534), 0);
  try {
    HostShare::attach(opts_);
    FAIL() << "another user's directory was accepted";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to uid 65534"), std::string::npos) << e.what();
  }
}

// ---- when sharing fails (Note [Shared pins], "When sharing fails")

struct Refused {
  std::string reason = "attached", message;
};
Refused try_attach(const ShareOptions& o) {
  Refused r;
  try {
    HostShare::attach(o);
  } catch (const AttachError& e) {
    r.reason = e.reason;
    r.message = e.what();
  }
  return r;
}

// A full tmpfs: a file whose pages are all reserved already needs nothing more.
int no_space(int fd, off_t length) {
  struct stat st {};
  return fstat(fd, &st) == 0 && st.st_blocks * 512 >= length ? 0 : ENOSPC;
}

TEST_F(HostShareTest, AFullTmpfsRefusesTheIndexAndLeavesNothing) {
  testing::set_reserve(no_space);
  const Refused r = try_attach(opts_);
  testing::set_reserve(nullptr);
  EXPECT_EQ(r.reason, "space") << r.message;
  EXPECT_NE(r.message.find(dir_ + "/index"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("is full"), std::string::npos) << r.message;
  EXPECT_FALSE(fs::exists(dir_)) << "the index, and the directory made for it, stay";
  // A process attached before: its index's pages are reserved, its next
  // segment is refused (the pin is made privately), not a signal.
  auto a = HostShare::attach(opts_);
  testing::set_reserve(no_space);
  auto b = HostShare::attach(opts_);
  EXPECT_EQ(b->acquire(key(0)).kind, Grant::Kind::None);
  testing::set_reserve(nullptr);
  EXPECT_EQ(b->stats().refused, 1u);
  EXPECT_TRUE(segments().empty());
  const Grant g = b->acquire(key(0));
  EXPECT_EQ(g.kind, Grant::Kind::Write) << "room again";
  release(*b, g);
}

TEST_F(HostShareTest, TheSlotTableHoldsTwoHundredFiftySixProcesses) {
  std::vector<std::shared_ptr<HostShare>> all;
  for (uint32_t i = 0; i < kSlots; ++i) all.push_back(HostShare::attach(opts_));
  EXPECT_EQ(all.back()->stats().processes, kSlots);
  const Refused r = try_attach(opts_);
  EXPECT_EQ(r.reason, "slots") << r.message;
  EXPECT_NE(r.message.find("256 processes share"), std::string::npos) << r.message;
  all.pop_back();  // a slot free again
  EXPECT_EQ(try_attach(opts_).reason, "attached");
}

TEST_F(HostShareTest, AShareDirNotInRamIsRefusedBeforeAnythingIsMade) {
  std::string disk = fs::current_path().string() + "/pins-share-disk-XXXXXX";
  ASSERT_NE(mkdtemp(disk.data()), nullptr);
  ShareOptions o = opts_;
  o.root = disk;
  const Refused r = try_attach(o);
  const bool in_ram = r.reason == "attached";
  fs::remove_all(disk);
  if (in_ram) GTEST_SKIP() << fs::current_path() << " is in RAM here: no disk to try";
  EXPECT_EQ(r.reason, "filesystem") << r.message;
  EXPECT_NE(r.message.find("set share_dir to a tmpfs"), std::string::npos) << r.message;
}

// Note [Bounded index lock]: the lock held by a description that never lets
// go (a peer stopped while it holds it).
class HeldIndexLock {
 public:
  explicit HeldIndexLock(const std::string& index) : fd_(::open(index.c_str(), O_RDWR)) {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_len = 1;
    held_ = fd_ >= 0 && fcntl(fd_, F_OFD_SETLK, &fl) == 0;
  }
  ~HeldIndexLock() { ::close(fd_); }  // the kernel drops the lock with its description
  bool held() const { return held_; }

 private:
  int fd_;
  bool held_ = false;
};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST_F(HostShareTest, AStoppedLockHolderCostsOneBoundThenUpdatesWaitForTheNextTake) {
  ShareOptions quick = opts_;
  quick.lock_wait_ms = 200;
  auto a = HostShare::attach(quick);
  auto b = HostShare::attach(quick);
  const Grant w = a->acquire(key(0));
  ASSERT_TRUE(a->publish(w));
  const Grant r = b->acquire(key(0));
  ASSERT_EQ(r.kind, Grant::Kind::Ready);
  const Grant w2 = a->acquire(key(8192));
  ASSERT_EQ(w2.kind, Grant::Kind::Write);
  EXPECT_EQ(a->stats().entries, 2u);
  auto held = std::make_unique<HeldIndexLock>(dir_ + "/index");
  ASSERT_TRUE(held->held());
  Grant g;
  const double first = seconds_of([&] { g = a->acquire(key(16384)); });
  EXPECT_EQ(g.kind, Grant::Kind::None);
  EXPECT_GE(first, 0.19);
  EXPECT_LT(first, 2.0);
  const double second = seconds_of([&] { g = a->acquire(key(16384)); });
  EXPECT_EQ(g.kind, Grant::Kind::None);
  EXPECT_LT(second, 0.1) << "after a wait ran out a take tries once";
  EXPECT_FALSE(a->publish(w2)) << "not now: at the next take";
  release(*b, r);  // b's lease: dropped at its next take
  EXPECT_TRUE(holds(w, 0)) << "the mappings stay valid";
  const ShareStats s = a->stats();
  EXPECT_EQ(s.lock_timeouts, 4u) << "two acquires, the publish, the stats";
  EXPECT_EQ(s.entries, 2u) << "the host's figures as last seen";
  EXPECT_EQ(try_attach(quick).reason, "lock");
  held.reset();  // the peer runs again
  EXPECT_EQ(a->stats().published, 2u) << "a's next take made its pending publish";
  const Grant joined = b->acquire(key(8192));
  EXPECT_EQ(joined.kind, Grant::Kind::Ready);
  release(*b, joined);
  release(*a, w2);
  release(*a, w);
  EXPECT_TRUE(segments().empty()) << "every pending release was made";
}

TEST_F(HostShareTest, ADetachPastTheBoundClosesTheIndexAndThePeersReclaimTheSlot) {
  ShareOptions quick = opts_;
  quick.lock_wait_ms = 200;
  auto a = HostShare::attach(quick);
  auto b = HostShare::attach(quick);
  const Grant w = a->acquire(key(0));
  ASSERT_TRUE(a->publish(w));
  {
    HeldIndexLock held(dir_ + "/index");
    ASSERT_TRUE(held.held());
    EXPECT_LT(seconds_of([&] { a->detach(); }), 2.0);
  }
  EXPECT_EQ(a->acquire(key(8192)).kind, Grant::Kind::None) << "detached";
  EXPECT_EQ(b->stats().processes, 1u);
  b->detach();  // sweeps a's dead slot: its entry goes, and b is the last one out
  EXPECT_FALSE(fs::exists(dir_));
  release(*a, w);
}

// Note [Shared pins], the threat model: processes of the same user are
// trusted, so an entry a peer of this user wrote, checksum and all, is
// believed; what the checks stop is a torn or garbled entry, and an entry
// whose file is not a segment this process could map safely.
TEST_F(HostShareTest, AnEntryIsCheckedForSenseNotForItsAuthor) {
  auto a = HostShare::attach(opts_);
  const Grant w = a->acquire(key(0));
  fill(w, 'a');
  ASSERT_TRUE(a->publish(w));
  // A Ready entry forged by a peer of this user, checksum and all, naming a
  // segment file it wrote: believed (it could as well write into a real segment).
  const Key forged = key(32768);
  const uint32_t at = static_cast<uint32_t>(key_hash(forged)) & (kEntries - 1);
  const uint64_t gen = 77;
  {
    const int f = ::open((dir_ + "/" + segment_name(at, gen)).c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(f, 0);
    const std::vector<char> bytes(8192, 'f');
    ASSERT_EQ(::write(f, bytes.data(), bytes.size()), 8192);
    ::close(f);
    RawIndex raw(dir_ + "/index");
    auto* e = reinterpret_cast<Entry*>(raw.entry(at));
    ASSERT_EQ(e->state, kEmpty);
    *e = Entry{};
    e->state = kReady;
    e->generation = gen;
    e->key = forged;
    e->leases.add(kSlots - 1);
    seal(*e);
  }
  auto b = HostShare::attach(opts_);
  const Grant r = b->acquire(forged);
  ASSERT_EQ(r.kind, Grant::Kind::Ready);
  EXPECT_TRUE(holds(r, 'f'));
  release(*b, r);
  // Sealed but senseless (a writer past the slots): dropped as torn.
  {
    RawIndex raw(dir_ + "/index");
    auto* e = reinterpret_cast<Entry*>(raw.entry(w.entry));
    e->writer = kSlots + 5;
    e->state = kWriting;
    seal(*e);
  }
  const Grant again = b->acquire(key(0));
  EXPECT_EQ(again.kind, Grant::Kind::Write);
  EXPECT_EQ(b->stats().torn, 1u);
  release(*b, again);
  // A Ready entry whose file is shorter than its range: not mapped (no SIGBUS).
  const Grant w2 = b->acquire(key(8192));
  ASSERT_TRUE(b->publish(w2));
  ASSERT_EQ(truncate((dir_ + "/" + segment_name(w2.entry, w2.generation)).c_str(), 4096), 0);
  auto c = HostShare::attach(opts_);
  EXPECT_EQ(c->acquire(key(8192)).kind, Grant::Kind::None);
  EXPECT_EQ(c->stats().errors, 1u);
  release(*a, w);
  release(*b, w2);
}

}  // namespace
}  // namespace pins::share
