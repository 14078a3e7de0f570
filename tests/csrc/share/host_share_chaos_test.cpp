// Note [Shared pins], crash safety: four workers (chaos_worker.cpp) cast every
// layer of one file through shared pins and check every byte, while this
// driver SIGKILLs a random one at random moments (mid-fill, mid-eviction,
// mid-update of the index) and starts another. No wrong byte, no worker stuck,
// and once the last worker exits no file is left.
//
// PINS_CHAOS_SEED replays a run; PINS_CHAOS_KILLS sets how many kills (200).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
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

  const auto spawn = [&](Worker& w) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    const std::string wseed = std::to_string(rng());
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], 3);
      if (p[0] != 3) close(p[0]);
      if (p[1] != 3) close(p[1]);
      execl(PINS_CHAOS_WORKER, PINS_CHAOS_WORKER, file.c_str(), root.c_str(), std::to_string(kLayers).c_str(),
            std::to_string(kLayerBytes).c_str(), wseed.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    w.pid = pid;
    w.progress = p[0];
    w.last = Clock::now();
  };
  uint64_t passes = 0, kills = 0, wrong = 0, odd_exits = 0;
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
    else if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) odd_exits++;
  };

  std::vector<Worker> workers(4);
  for (Worker& w : workers) spawn(w);
  const auto deadline = Clock::now() + std::chrono::seconds(240);
  while (kills < target_kills && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 25000));
    for (Worker& w : workers) {
      drain(w);
      ASSERT_LT(Clock::now() - w.last, std::chrono::seconds(30))
          << "worker " << w.pid << " made no progress for 30 s: stuck (seed " << seed << ")";
    }
    Worker& w = workers[rng() % workers.size()];
    kill(w.pid, SIGKILL);
    int status = 0;
    waitpid(w.pid, &status, 0);
    account(status);
    drain(w);
    close(w.progress);
    kills++;
    spawn(w);
  }
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
    unsigned long long j = 0, f = 0, d = 0, t = 0;
    if (std::sscanf(w.tail.c_str(), " stats %llu %llu %llu %llu", &j, &f, &d, &t) == 4) {
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
  fs::remove_all(root);
  fs::remove(file);
}

}  // namespace
}  // namespace pins
