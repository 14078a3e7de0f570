// pins-bench: the project's benchmarks. `pins-bench <name> [options]`.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace pins::bench {
int alloc_main(const std::vector<std::string>& args);
}

int main(int argc, char** argv) {
  struct Entry {
    const char* name;
    int (*run)(const std::vector<std::string>&);
    const char* what;
  };
  const Entry entries[] = {
      {"alloc", &pins::bench::alloc_main, "host pool: waste against power-of-two rounding, warm latency against malloc"},
  };
  if (argc >= 2) {
    for (const Entry& e : entries) {
      if (std::strcmp(argv[1], e.name) == 0) {
        try {
          return e.run(std::vector<std::string>(argv + 2, argv + argc));
        } catch (const std::exception& ex) {
          std::fprintf(stderr, "pins-bench %s: %s\n", e.name, ex.what());
          return 1;
        }
      }
    }
  }
  std::fprintf(stderr, "usage: pins-bench <benchmark> [options]\n");
  for (const Entry& e : entries) std::fprintf(stderr, "  %-8s %s\n", e.name, e.what);
  return 2;
}
