// Note [Shared pins], crash safety: four workers (chaos_worker.cpp) cast every
// layer of one file through shared pins and check every byte, while this
// driver SIGKILLs a random one at random moments (mid-fill, mid-eviction,
// mid-update of the index) and starts another. Now and then it freezes one
// while it holds the index lock (SIGSTOP, Note [Bounded index lock]) until
// every other worker made a pass, and for a stretch it fills the tmpfs (a
// tmpfs of the test's own when it may mount one, else the workers' reservation
// seam), then restarts every worker on it: they cannot make the index and pin
// privately. No wrong byte, no worker stuck or dead of a signal (a SIGBUS),
// and once the last worker exits no file is left.
//
// PINS_CHAOS_SEED replays a run; PINS_CHAOS_KILLS sets how many kills (200);
// PINS_CHAOS_NO_MOUNT=1 fills the tmpfs through the seam even where it may mount.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tests/csrc/share/chaos_pattern.h"

#ifndef PINS_CHAOS_WORKER
#error "PINS_CHAOS_WORKER names the chaos_worker binary"
#endif

namespace pins {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Worker {
  pid_t pid = -1;
  int progress = -1;  // read end of its fd 3
  Clock::time_point last;
  uint64_t passes = 0;
  std::string tail;  // what came after its ticks: the stats line of a clean stop
};

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

TEST(ShareChaos, RandomKillsNeverServeAWrongByteNorLeaveFiles) {
  const uint64_t seed = env_or("PINS_CHAOS_SEED", std::random_device{}());
  const uint64_t target_kills = env_or("PINS_CHAOS_KILLS", 200);
  std::printf("ShareChaos seed=%llu (PINS_CHAOS_SEED replays it)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);

  constexpr uint64_t kLayers = 12, kLayerBytes = 512 * 1024;
  std::string file = (fs::temp_directory_path() / "pins-chaos-XXXXXX").string();
  const int fd = mkstemp(file.data());
  ASSERT_GE(fd, 0);
  {
    std::vector<char> buf(kLayerBytes);
    for (uint64_t l = 0; l < kLayers; ++l) {
      testing::chaos_fill(buf.data(), l * kLayerBytes, kLayerBytes);
      ASSERT_EQ(write(fd, buf.data(), buf.size()), static_cast<ssize_t>(buf.size()));
    }
    close(fd);
  }
  std::string root = (fs::is_directory("/dev/shm") ? std::string("/dev/shm") : fs::temp_directory_path().string()) +
                     "/pins-chaos-root-XXXXXX";
  ASSERT_NE(mkdtemp(root.data()), nullptr);
  const std::string dir = root + "/pins-" + std::to_string(geteuid());
  // A tmpfs of its own to fill (64 MiB: the index, every layer's segment and
  // room to spare), where the test may mount one; else the workers' seam.
  const bool mounted = env_or("PINS_CHAOS_NO_MOUNT", 0) == 0 &&
                       mount("tmpfs", root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0700") == 0;
  const std::string full_flag = root + "-full";
  // Declared before the guard below, so that it outlives it.
  std::vector<Worker> workers(4);
  // Also when an assertion ends the test early: no worker, mount or file is
  // left (in /dev/shm or /tmp).
  struct Leftovers {
    std::string root, full_flag, file;
    bool mounted;
    std::vector<Worker>* workers = nullptr;
    ~Leftovers() {
      for (size_t i = 0; workers != nullptr && i < workers->size(); ++i) {
        const pid_t pid = (*workers)[i].pid;
        int status = 0;
        if (pid > 0 && waitpid(pid, &status, WNOHANG) == 0) {  // a child not reaped yet
          kill(pid, SIGKILL);
          waitpid(pid, &status, 0);
        }
      }
      if (mounted) umount2(root.c_str(), MNT_DETACH);
      std::error_code ec;
      fs::remove_all(root, ec);
      fs::remove(full_flag, ec);
      fs::remove(file, ec);
    }
  } leftovers{root, full_flag, file, mounted, &workers};
  std::printf("ShareChaos: the tmpfs is filled %s\n", mounted ? "for real (a tmpfs of its own)"
                                                               : "through the reservation seam (no mount allowed)");
  int fillers = 0;
  const auto fill_tmpfs = [&] {
    if (!mounted) {
      std::fclose(std::fopen(full_flag.c_str(), "w"));
      return;
    }
    // 64 KiB at a time until none is left (the workers allocate meanwhile):
    // less room than a segment or the index needs.
    const int f = ::open((root + "/filler" + std::to_string(fillers++)).c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(f, 0);
    for (off_t at = 0; posix_fallocate(f, at, 64 * 1024) == 0; at += 64 * 1024) {
    }
    close(f);
  };
  const auto empty_tmpfs = [&] {
    fs::remove(full_flag);
    while (fillers > 0) fs::remove(root + "/filler" + std::to_string(--fillers));
  };

  const auto spawn = [&](Worker& w) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    const std::string wseed = std::to_string(rng());
    // SIGUSR1, SIGUSR2 and SIGTERM held from the fork until the worker has
    // its handlers: their default would end it (a worker stopped just after
    // its start died of SIGTERM, an odd exit).
    sigset_t usr, was;
    sigemptyset(&usr);
    sigaddset(&usr, SIGUSR1);
    sigaddset(&usr, SIGUSR2);
    sigaddset(&usr, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &usr, &was);
    const pid_t pid = fork();
    if (pid != 0) pthread_sigmask(SIG_SETMASK, &was, nullptr);
    if (pid == 0) {
      dup2(p[1], 3);
      if (p[0] != 3) close(p[0]);
      if (p[1] != 3) close(p[1]);
      if (!mounted) setenv("PINS_CHAOS_FULL", full_flag.c_str(), 1);
      execl(PINS_CHAOS_WORKER, PINS_CHAOS_WORKER, file.c_str(), root.c_str(), std::to_string(kLayers).c_str(),
            std::to_string(kLayerBytes).c_str(), wseed.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    w.pid = pid;
    w.tail.clear();  // what its predecessor wrote after its ticks
    w.progress = p[0];
    w.last = Clock::now();
  };
  uint64_t passes = 0, kills = 0, wrong = 0, odd_exits = 0;
  std::vector<Worker*> workers_of;
  const auto drain = [&](Worker& w) {
    char buf[256];
    for (ssize_t got; (got = read(w.progress, buf, sizeof buf)) > 0;) {
      for (ssize_t i = 0; i < got; ++i) {
        if (!w.tail.empty() || buf[i] != 'p') {
          w.tail += buf[i];
          continue;
        }
        w.passes++;
        passes++;
      }
      w.last = Clock::now();
    }
  };
  const auto account = [&](int status) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) wrong++;
    else if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
      odd_exits++;
      std::printf("ShareChaos: a worker %s %d\n", WIFEXITED(status) ? "exited with status" : "died of signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
  };

  // Waits up to `limit` until every worker but `but` made `need` passes since now.
  const auto others_pass = [&](const Worker* but, std::chrono::seconds limit, uint64_t need = 1) {
    std::vector<uint64_t> since(workers_of.size());
    for (size_t i = 0; i < workers_of.size(); ++i) since[i] = workers_of[i]->passes;
    const auto by = Clock::now() + limit;
    for (;;) {
      bool all = true;
      for (size_t i = 0; i < workers_of.size(); ++i) {
        drain(*workers_of[i]);
        all = all && (workers_of[i] == but || workers_of[i]->passes >= since[i] + need);
      }
      if (all) return true;
      if (Clock::now() >= by) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  const auto stop_cleanly = [&](Worker& w) {
    kill(w.pid, SIGTERM);
    int status = 0;
    waitpid(w.pid, &status, 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) account(status);
    drain(w);
    close(w.progress);
  };

  for (Worker& w : workers) {
    spawn(w);
    workers_of.push_back(&w);
  }
  // Freezes spread over the kills, and the tmpfs full from a third of them to
  // a half, with every worker restarted on it at the half.
  const uint64_t freezes = std::max<uint64_t>(2, target_kills / 25);
  uint64_t frozen = 0, held = 0, full_restarts = 0;
  const uint64_t fill_at = target_kills / 3, restart_at = target_kills / 2;
  const auto deadline = Clock::now() + std::chrono::seconds(240);
  while (kills < target_kills && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 25000));
    for (Worker& w : workers) {
      drain(w);
      ASSERT_LT(Clock::now() - w.last, std::chrono::seconds(30))
          << "worker " << w.pid << " made no progress for 30 s: stuck (seed " << seed << ")";
    }
    if (kills == fill_at && full_restarts == 0) fill_tmpfs();
    if (kills == restart_at && full_restarts == 0) {
      // Every worker out and in again while the tmpfs is full: the last one
      // out removes the share; the new ones cannot make the index.
      for (Worker& w : workers) stop_cleanly(w);
      EXPECT_FALSE(fs::exists(dir + "/index")) << "the last worker out left the index (seed " << seed << ")";
      fill_tmpfs();  // again: the segments that went freed their room
      for (Worker& w : workers) spawn(w);
      EXPECT_TRUE(others_pass(nullptr, std::chrono::seconds(30)))
          << "workers started on a full tmpfs made no pass (seed " << seed << ")";
      EXPECT_FALSE(fs::exists(dir + "/index")) << "an index was made on a full tmpfs (seed " << seed << ")";
      empty_tmpfs();
      full_restarts++;
      continue;
    }
    Worker& w = workers[rng() % workers.size()];
    if (frozen < freezes && kills >= (frozen + 1) * target_kills / (freezes + 1)) {
      // Frozen while it holds the index lock: every other worker goes on.
      frozen++;
      kill(w.pid, SIGUSR1);
      int status = 0;
      pid_t got = 0;
      const auto stop_by = Clock::now() + std::chrono::seconds(5);
      while ((got = waitpid(w.pid, &status, WNOHANG | WUNTRACED)) == 0 && Clock::now() < stop_by)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (got == w.pid && WIFSTOPPED(status)) {
        held++;
        // The others drop their pins: their next whole pass misses every layer.
        for (Worker& o : workers)
          if (&o != &w) kill(o.pid, SIGUSR2);
        EXPECT_TRUE(others_pass(&w, std::chrono::seconds(15), 2))
            << "worker " << w.pid << " stopped holding the index lock, and the others made no pass in 15 s (seed "
            << seed << ")";
        kill(w.pid, SIGCONT);
        continue;
      }
      // It took no lock in 5 s (it pins privately): killed below, as any other.
    }
    kill(w.pid, SIGKILL);
    int status = 0;
    waitpid(w.pid, &status, 0);
    account(status);
    drain(w);
    close(w.progress);
    kills++;
    spawn(w);
  }
  EXPECT_GT(held, 0u) << "no worker stopped holding the index lock (seed " << seed << ")";
  std::printf("ShareChaos: %llu of %llu freezes stopped a worker holding the index lock, %llu restarts on a full "
              "tmpfs\n", static_cast<unsigned long long>(held), static_cast<unsigned long long>(frozen),
              static_cast<unsigned long long>(full_restarts));
  EXPECT_EQ(full_restarts, 1u);
  // A last stretch without kills, until every worker (survivors and new ones)
  // finished a pass of its own since: none is stuck on what the kills left.
  std::vector<uint64_t> at(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    drain(workers[i]);
    at[i] = workers[i].passes;
  }
  const auto stuck_by = Clock::now() + std::chrono::seconds(30);
  for (bool all = false; !all && Clock::now() < stuck_by;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    all = true;
    for (size_t i = 0; i < workers.size(); ++i) {
      drain(workers[i]);
      all = all && workers[i].passes > at[i];
    }
  }
  for (size_t i = 0; i < workers.size(); ++i)
    EXPECT_GT(workers[i].passes, at[i]) << "worker " << workers[i].pid << " made no pass in 30 s after the kills "
                                        << "stopped: stuck (seed " << seed << ")";
  for (Worker& w : workers) kill(w.pid, SIGTERM);
  uint64_t clean = 0, joins = 0, fills = 0, dead_slots = 0;
  for (Worker& w : workers) {
    int status = 0;
    const auto stop_by = Clock::now() + std::chrono::seconds(30);
    pid_t got = 0;
    while ((got = waitpid(w.pid, &status, WNOHANG)) == 0 && Clock::now() < stop_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (got == 0) {
      kill(w.pid, SIGKILL);
      waitpid(w.pid, &status, 0);
      ADD_FAILURE() << "worker " << w.pid << " did not stop within 30 s of SIGTERM (seed " << seed << ")";
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      clean++;
    } else {
      account(status);
    }
    drain(w);
    close(w.progress);
    unsigned long long j = 0, f = 0, d = 0, t = 0, lt = 0, sh = 0;
    if (std::sscanf(w.tail.c_str(), " stats %llu %llu %llu %llu %llu %llu", &j, &f, &d, &t, &lt, &sh) == 6) {
      joins += j;
      fills += f;
      dead_slots += d;
    }
  }
  std::printf("ShareChaos: the last four workers joined %llu segments, filled %llu, reclaimed %llu dead slots\n",
              static_cast<unsigned long long>(joins), static_cast<unsigned long long>(fills),
              static_cast<unsigned long long>(dead_slots));
  EXPECT_GT(joins, 0u) << "no worker joined a segment another filled: nothing was shared";
  std::printf("ShareChaos: %llu kills, %llu passes checked (%llu layers each), %llu wrong, %llu odd exits, %llu clean "
              "stops\n",
              static_cast<unsigned long long>(kills), static_cast<unsigned long long>(passes),
              static_cast<unsigned long long>(kLayers), static_cast<unsigned long long>(wrong),
              static_cast<unsigned long long>(odd_exits), static_cast<unsigned long long>(clean));
  EXPECT_EQ(kills, target_kills) << "ran out of time (seed " << seed << ")";
  EXPECT_EQ(wrong, 0u) << "a worker got a wrong byte (seed " << seed << ")";
  EXPECT_EQ(odd_exits, 0u) << "a worker died of something other than the kills (seed " << seed << ")";
  EXPECT_EQ(clean, workers.size());
  EXPECT_FALSE(fs::exists(dir)) << "the last worker out left " << dir;
}

}  // namespace
}  // namespace pins
