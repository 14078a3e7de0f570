// The pins-sim command line (docs/SIMULATOR.md "Command line"), callable in
// process so that tests drive exactly what users run.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pins::sim {

// args excludes the program name. Returns the exit status: 0 ok (--help: the
// usage on `out`), 2 bad usage or an invalid trace (the message on `err` names
// the argument or the field).
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pins::sim
