#include "profiling/bench/model_params.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace pins::bench {

std::vector<Param> read_model_params(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open model parameter file " + path);
  std::vector<Param> out;
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
    try {
      out.push_back({model, tensor, std::stoull(numel)});
    } catch (const std::exception&) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": numel '" + numel + "' is not a number");
    }
  }
  return out;
}

}  // namespace pins::bench
