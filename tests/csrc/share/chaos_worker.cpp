// A worker of ShareChaos (host_share_chaos_test.cpp): casts every layer of a
// file through a Runtime with share:true, as ops/cast_path.cpp does (acquire,
// fill from the file, copy out of the pin), and checks every byte it gets
// against the file's pattern. Now and then it frees pins (an eviction: leases
// dropped, segments unlinked). Writes one byte to fd 3 after each pass; exits
// 2 at the first wrong byte, 0 when SIGTERM asks it to stop, after a line
// "stats JOINS FILLS DEAD_SLOTS TORN LOCK_TIMEOUTS SHARED" on fd 3.
// After SIGUSR1 it stops itself (SIGSTOP) the next time it takes the index
// lock, holding it (Note [Bounded index lock]); after SIGUSR2 it frees every
// pin before its next pass, so that pass needs the index for every layer. With PINS_CHAOS_FULL set, the
// reservation of the index's and the segments' pages fails (ENOSPC) while a
// file of that name exists: a full tmpfs, where the test cannot mount one.
//
//   chaos_worker FILE SHARE_ROOT LAYERS LAYER_BYTES SEED
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "csrc/files/mapped.h"
#include "csrc/runtime/runtime.h"
#include "csrc/share/share_testing.h"
#include "tests/csrc/share/chaos_pattern.h"

namespace {

std::atomic<bool> g_stop{false};
void on_term(int) { g_stop.store(true); }

std::atomic<bool> g_freeze{false};
void on_usr1(int) { g_freeze.store(true); }
std::atomic<bool> g_drop{false};
void on_usr2(int) { g_drop.store(true); }
void stop_holding_the_lock() {
  if (g_freeze.exchange(false)) raise(SIGSTOP);
}

const char* g_full = nullptr;
int reserve_unless_full(int fd, off_t length) {
  struct stat st {};  // as on a full tmpfs: a file whose pages are all there needs none
  if (g_full != nullptr && access(g_full, F_OK) == 0 && !(fstat(fd, &st) == 0 && st.st_blocks * 512 >= length))
    return ENOSPC;
  return posix_fallocate(fd, 0, length);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pins;
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf("usage: %s FILE SHARE_ROOT LAYERS LAYER_BYTES SEED\n"
                "A child process of the ShareChaos test (pins_share_tests), not a tool: it casts every layer\n"
                "of FILE through shared pins under SHARE_ROOT until SIGTERM, checking every byte.\n",
                argv[0]);
    return 0;
  }
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s FILE SHARE_ROOT LAYERS LAYER_BYTES SEED\n", argv[0]);
    return 64;
  }
  signal(SIGTERM, on_term);
  signal(SIGUSR1, on_usr1);
  signal(SIGUSR2, on_usr2);
  sigset_t usr;  // blocked by the driver until now
  sigemptyset(&usr);
  sigaddset(&usr, SIGUSR1);
  sigaddset(&usr, SIGUSR2);
  sigaddset(&usr, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &usr, nullptr);
  share::testing::set_on_locked(stop_holding_the_lock);
  g_full = std::getenv("PINS_CHAOS_FULL");
  if (g_full != nullptr) share::testing::set_reserve(reserve_unless_full);
  const std::string path = argv[1];
  const uint64_t layers = std::strtoull(argv[3], nullptr, 10);
  const uint64_t n = std::strtoull(argv[4], nullptr, 10);
  std::mt19937_64 rng(std::strtoull(argv[5], nullptr, 10));

  Config c;
  c.share = true;
  c.share_dir = argv[2];
  c.backend = BackendKind::Cpu;
  c.monitor = false;
  c.prewarm = false;
  c.headroom = 0;
  c.pin_reserve = 0;
  Runtime rt(c);
  Balancer& bal = rt.balancer();
  const auto file = files::MappedFile::open(path);
  const ModelId m = bal.register_model("chaos", "cpu");
  bal.mark_prompt({m});
  std::vector<char> out(n);
  std::vector<uint64_t> order(layers);
  for (uint64_t i = 0; i < layers; ++i) order[i] = i;
  while (!g_stop.load()) {
    if (g_drop.exchange(false)) bal.free(layers * n, /*evict_active=*/true);  // every layer a miss again
    std::shuffle(order.begin(), order.end(), rng);
    for (const uint64_t layer : order) {
      const char* src = file->data() + layer * n;
      Request r;
      r.model = m;
      r.key = PinKey{1, layer * n, n, 0};
      r.bytes = n;
      r.data = src;
      r.op = "chaos";
      Lease l = bal.acquire(r);
      if (l && l.needs_fill()) {
        if (!files::fill_from_file(src, n, l.data(), 1, l.shared_fill())) std::memcpy(l.data(), src, n);
        l.filled();
      }
      std::memcpy(out.data(), l ? l.data() : src, n);
      const uint64_t bad = testing::first_wrong_byte(out.data(), layer * n, n);
      if (bad != n) {
        std::fprintf(stderr, "chaos_worker %d: layer %llu byte %llu wrong (%s)\n", getpid(),
                     static_cast<unsigned long long>(layer), static_cast<unsigned long long>(bad),
                     l ? (l.hit() ? "a hit" : "a new pin") : "the source");
        std::_Exit(2);
      }
    }
    if (rng() % 3 == 0) bal.free(static_cast<size_t>(rng() % (layers * n)), /*evict_active=*/true);
    const char tick = 'p';
    ssize_t wrote = 0;
    while ((wrote = write(3, &tick, 1)) < 0 && errno == EINTR) {
    }
    if (wrote != 1) break;  // the driver is gone
  }
  // What it shared, for the driver: joins and fills (a line after the ticks).
  // A worker that could not attach (a full tmpfs) pinned privately.
  const share::ShareStats s = rt.share() != nullptr ? rt.share()->stats() : share::ShareStats{};
  const std::string line = "\nstats " + std::to_string(s.joins) + " " + std::to_string(s.fills) + " " +
                           std::to_string(s.dead_slots) + " " + std::to_string(s.torn) + " " +
                           std::to_string(s.lock_timeouts) + " " + std::to_string(rt.share() != nullptr) + "\n";
  (void)!write(3, line.data(), line.size());
  return 0;
}
