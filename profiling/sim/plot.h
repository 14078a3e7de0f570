// The PNG plot: one panel per sequence, disk bytes read per run as bars, one
// per policy, with the lower bound (black) and W (grey, dashed) per run.
#pragma once

#include <string>
#include <vector>

#include "profiling/sim/report.h"

namespace pins::sim {

void plot_png(const std::string& path, const Trace& trace, const std::vector<SequenceResult>& results);

}  // namespace pins::sim
