// pins-bench: the project's benchmarks. `pins-bench <name> [options]`.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace pins::bench {
int alloc_main(const std::vector<std::string>& args);
int fill_main(const std::vector<std::string>& args);
int balancer_main(const std::vector<std::string>& args);
int load_main(const std::vector<std::string>& args);
#ifdef PINS_BENCH_WITH_TORCH
int cast_main(const std::vector<std::string>& args);
int lowvram_main(const std::vector<std::string>& args);
#endif
}

namespace {

struct Benchmark {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* what;
  const char* options;  // one "  --flag VALUE  meaning" line each
};

const Benchmark kBenchmarks[] = {
    {"alloc", &pins::bench::alloc_main, "host pool: waste against power-of-two rounding, warm latency against malloc",
     "  --data FILE   model parameter list (default: profiling/data/model_params.csv)\n"
     "  --reps N      timing repetitions; the best one counts (default: 15)\n"},
    {"fill", &pins::bench::fill_main,
     "filling a pin: warm, a new pin through Balancer::acquire after an eviction, a new pin into fresh pages "
     "(prewarm off, prewarmed ahead, prewarm racing it), and a chunked fill on several threads, against memcpy "
     "into a warm malloc'd buffer",
     "  --size SIZE   bytes per pin, Note [Size syntax] (default: 512M); uses about 6x SIZE of RAM\n"
     "  --reps N      repetitions; medians count (default: 5)\n"
     "  --threads N   threads of the chunked fill (default: 2)\n"},
    {"balancer", &pins::bench::balancer_main,
     "one eviction decision (Balancer::free) and one prompt boundary, as the pin count grows (null backend)",
     "  --pins LIST       pin counts, comma-separated (default: 1000,10000,100000)\n"
     "  --policies LIST   of mru, lru, trace, comma-separated (default: mru,trace,lru)\n"
     "  --reps N          repetitions; medians count (default: 5)\n"
     "  --decisions K     decisions timed per repetition, averaged (default: 20)\n"},
    {"load", &pins::bench::load_main,
     "a weight read from its file into a pin (O_DIRECT where the filesystem allows it), and copied through a "
     "mapping, against a raw sequential O_DIRECT read of the same file",
     "  --size SIZE   bytes of the file, Note [Size syntax] (default: 1G); uses about 2x SIZE of RAM and SIZE of disk\n"
     "  --dir DIR     where the file is written, then removed (default: the current directory)\n"
     "  --reps N      repetitions; medians count (default: 3)\n"
     "  --threads N   threads of the fill (default: files::kReadThreads, 4)\n"},
#ifdef PINS_BENCH_WITH_TORCH
    {"cast", &pins::bench::cast_main,
     "the pins::cast_to_device op: a hit on a 4 KiB pin and model=-1 against clone(), the hit with the content "
     "check off against on (hot, and cold over many sources), a 512 MiB hit against at::empty + copy_ (CPU device)",
     "  --size SIZE   bytes of the bandwidth source, Note [Size syntax] (default: 512M); uses about 3x SIZE of "
     "RAM\n"
     "  --calls K     calls timed per repetition of the 4 KiB figures, averaged (default: 20000)\n"
     "  --cold N      sources of 4 KiB of the cold content-check figures, and N/16 of 64 KiB, each hit once\n"
     "                per pass (default: 16384: 2x 64 MiB each with their pins, more than most last-level caches)\n"
     "  --reps N      repetitions; medians count (default: 5)\n"},
    {"lowvram", &pins::bench::lowvram_main,
     "a lowvram loop: every layer cast to bf16 through pins, half the model fitting in the pin budget, against "
     "w.to(bf16)",
     "  --layers L        layers (default: 200)\n"
     "  --layer-mib M     MiB of fp16 weights per layer (default: 32)\n"
     "  --passes P        passes over the layers, at least 2 (default: 5)\n"
     "  --policies LIST   of mru, lru, trace, comma-separated (default: mru,lru,trace)\n"
     "  --prewarm LIST    of off, ahead, racing, comma-separated (default: off,ahead,racing): the prewarm off,\n"
     "                    woken and waited for before each pins pass (the default configuration), or racing it\n"
     "  --device DEV      the device cast to (default: cpu; cuda:0 on a GPU machine)\n"
     "RAM: the sources take L x M MiB (6.4 GiB at the defaults) and the pins about half that again, so peak RSS is\n"
     "about 1.5 x L x M MiB (9.6 GiB); it needs MemAvailable above about 0.5 x L x M MiB + 2 GiB once the sources\n"
     "exist. The pin budget is set through pins::configure (headroom, pin_reserve) from MemAvailable.\n"},
#endif
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "usage: pins-bench <benchmark> [options]\n"
               "       pins-bench <benchmark> --help   the benchmark's options\n"
               "benchmarks:\n");
  for (const Benchmark& b : kBenchmarks) std::fprintf(to, "  %-9s %s\n", b.name, b.what);
}

bool is_help(const std::string& a) {
  return a == "-h" || a == "--help";
}

}  // namespace

// Exit status: 0 ok (and --help); 2 bad usage, with a message naming the
// argument; 1 a benchmark that failed.
int main(int argc, char** argv) {
  // Line by line even into a file or a pipe: the long benchmarks show progress.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(stderr);
    return 2;
  }
  if (is_help(args[0])) {
    print_usage(stdout);
    return 0;
  }
  for (const Benchmark& b : kBenchmarks) {
    if (args[0] != b.name) continue;
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const std::string& a : rest) {
      if (is_help(a)) {
        std::printf("usage: pins-bench %s [options]\n%s\noptions:\n%s", b.name, b.what, b.options);
        return 0;
      }
    }
    try {
      return b.run(rest);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "pins-bench %s: %s (pins-bench %s --help lists the options)\n", b.name, e.what(), b.name);
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pins-bench %s: %s\n", b.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "pins-bench: unknown benchmark \"%s\"\n", args[0].c_str());
  print_usage(stderr);
  return 2;
}
