#include "profiling/data/model_params.h"

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#ifndef PINS_DATA_DIR
#define PINS_DATA_DIR "profiling/data"
#endif

namespace pins::model_params {

std::string default_path() {
  return std::string(PINS_DATA_DIR) + "/model_params.csv";
}

std::vector<Model> read(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open model parameter file " + path);
  std::vector<Model> out;
  std::map<std::string, size_t> index;  // model name -> position in out
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#' || line.rfind("model,", 0) == 0) continue;
    std::istringstream is(line);
    std::string model, tensor, shape, numel;
    if (!std::getline(is, model, ',') || !std::getline(is, tensor, ',') || !std::getline(is, shape, ',') ||
        !std::getline(is, numel))
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": expected model,tensor,shape,numel");
    uint64_t n = 0;
    try {
      size_t used = 0;
      n = std::stoull(numel, &used);
      if (used != numel.size()) throw std::invalid_argument(numel);
    } catch (const std::exception&) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": numel '" + numel + "' is not a number");
    }
    const auto [it, added] = index.emplace(model, out.size());
    if (added) out.push_back({model, {}});
    out[it->second].tensors.push_back({std::move(tensor), n});
  }
  return out;
}

const Model* find(const std::vector<Model>& models, std::string_view name) {
  for (const Model& m : models)
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace pins::model_params
