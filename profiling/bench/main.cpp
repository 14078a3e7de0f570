// pins-bench: the project's benchmarks. `pins-bench <name> [options]`.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace pins::bench {
int alloc_main(const std::vector<std::string>& args);
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
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "usage: pins-bench <benchmark> [options]\n"
               "       pins-bench <benchmark> --help   the benchmark's options\n"
               "benchmarks:\n");
  for (const Benchmark& b : kBenchmarks) std::fprintf(to, "  %-8s %s\n", b.name, b.what);
}

bool is_help(const std::string& a) {
  return a == "-h" || a == "--help";
}

}  // namespace

// Exit status: 0 ok (and --help); 2 bad usage, with a message naming the
// argument; 1 a benchmark that failed.
int main(int argc, char** argv) {
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
