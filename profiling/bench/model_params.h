// Reads profiling/data/model_params.csv: every parameter tensor of public model
// architectures (see profiling/data/README.md for the sources).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pins::bench {

struct Param {
  std::string model;
  std::string tensor;
  uint64_t numel;
};

// Throws std::runtime_error naming the file and line on a malformed row.
std::vector<Param> read_model_params(const std::string& path);

}  // namespace pins::bench
