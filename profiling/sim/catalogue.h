// The models and workflow families the scenario generator draws from (Note
// [Simulator suite] in suite.h): the suite's, and the held-out sets' (Note
// [Simulator unseen sets]).
#pragma once

#include <string>
#include <vector>

namespace pins::sim {

// A model a family uses: from the parameter list (profiling/data), or `params`
// parameters in `layer_count` equal layers where the list has no such model
// (catalogue.cpp says where each count comes from).
struct ModelSpec {
  const char* key;
  const char* params_name;  // nullptr: sized
  double params = 0;        // sized: parameter count
  int layer_count = 0;
  double inference_gib = 0;
  bool scalable = true;  // may be stored at 1 byte per parameter (fp8)
};

// A workflow shape: encoders, then samplers (two experts split the steps),
// then the VAE decode.
struct Family {
  const char* name;
  std::vector<const char*> encoders, samplers;
  const char* vae;
  std::vector<int> steps;  // drawn from
};

// The spec named `key` (std::logic_error when none is).
const ModelSpec& model_spec(const std::string& key);
// The suite's eight families, in the order the generator draws them.
const std::vector<Family>& suite_families();
// Note [Simulator unseen sets]: the held-out sets' families.
const std::vector<Family>& unseen_families();

}  // namespace pins::sim
