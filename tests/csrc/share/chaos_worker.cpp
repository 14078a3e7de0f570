// A worker of ShareChaos (host_share_chaos_test.cpp): casts every layer of a
// file through a Runtime with share:true, as ops/cast_path.cpp does (acquire,
// fill from the file, copy out of the pin), and checks every byte it gets
// against the file's pattern. Now and then it frees pins (an eviction: leases
// dropped, segments unlinked). Writes one byte to fd 3 after each pass; exits
// 2 at the first wrong byte, 0 when SIGTERM asks it to stop, after a line
// "stats JOINS FILLS DEAD_SLOTS TORN" on fd 3.
//
//   chaos_worker FILE SHARE_ROOT LAYERS LAYER_BYTES SEED
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "csrc/files/mapped.h"
#include "csrc/runtime/runtime.h"
#include "tests/csrc/share/chaos_pattern.h"

namespace {

std::atomic<bool> g_stop{false};
void on_term(int) { g_stop.store(true); }

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
    if (write(3, &tick, 1) != 1) break;  // the driver is gone
  }
  // What it shared, for the driver: joins and fills (a line after the ticks).
  const share::ShareStats s = rt.share()->stats();
  const std::string line = "\nstats " + std::to_string(s.joins) + " " + std::to_string(s.fills) + " " +
                           std::to_string(s.dead_slots) + " " + std::to_string(s.torn) + "\n";
  (void)!write(3, line.data(), line.size());
  return 0;
}
