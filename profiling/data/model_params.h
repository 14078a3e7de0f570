// Reads model_params.csv: every parameter tensor of public model architectures
// (README.md here gives the sources), for the benchmarks and the simulator.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pins::model_params {

struct Tensor {
  std::string name;
  uint64_t numel = 0;
};

struct Model {
  std::string name;
  std::vector<Tensor> tensors;  // file order
};

// profiling/data/model_params.csv of the source tree this was built from.
std::string default_path();

// The models of the file in the order they first appear, each with its tensors
// in file order. Throws std::runtime_error naming the file and the line of a
// malformed row.
std::vector<Model> read(const std::string& path);

// The model called `name`; nullptr when absent.
const Model* find(const std::vector<Model>& models, std::string_view name);

}  // namespace pins::model_params
