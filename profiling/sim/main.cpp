// pins-sim: replays workflow traces through the real balancer over a modelled
// machine. See docs/SIMULATOR.md.
#include <iostream>

#include "profiling/sim/cli.h"

int main(int argc, char** argv) {
  return pins::sim::run_cli(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
