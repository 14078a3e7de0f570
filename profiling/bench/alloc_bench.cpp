// pins-bench alloc: what the host pool commits against what PyTorch's pinned
// allocator would (it rounds every block up to a power of two), when every
// parameter of real models is pinned; and the warm pool's allocate+free time
// against malloc+free for the same sizes, measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/pool/pool.h"
#include "csrc/config/config.h"
#include "profiling/data/model_params.h"

namespace pins::bench {
namespace {

// The headline row pins these four together; every model of the file gets its own row.
const char* const kHeadline[] = {"sdxl_unet", "flux1_dev", "wan21_14b", "t5xxl_encoder"};

uint64_t pow2_ceil(uint64_t n) {
  uint64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

struct Waste {
  uint64_t requested = 0, pool_committed = 0, pow2 = 0;
  size_t tensors = 0;
};

// Pins every size in `sizes` in a fresh pool (null backend: bookkeeping only, no RAM).
uint64_t pool_committed(const std::vector<uint64_t>& sizes) {
  PoolOptions o = pool_options(Config{});
  o.retain_free = ~size_t{0};
  HostPool pool(make_null_backend(), o);
  for (uint64_t n : sizes) pool.allocate(n);
  return static_cast<uint64_t>(pool.stats().committed_bytes.current);
}

template <typename F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int alloc_main(const std::vector<std::string>& args) {
  std::string path = model_params::default_path();
  int reps = 15;
  const size_t bytes_per_param = 2;  // fp16 / bf16 checkpoints
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
      return args[++i];
    };
    if (a == "--data") {
      path = value();
    } else if (a == "--reps") {
      const std::string v = value();
      size_t used = 0;
      try {
        reps = std::stoi(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != v.size() || reps < 1)
        throw std::invalid_argument("--reps: expected a positive integer, got \"" + v + "\"");
    } else {
      throw std::invalid_argument("unknown option \"" + a + "\"");
    }
  }
  const std::vector<model_params::Model> models = model_params::read(path);
  std::map<std::string, std::vector<uint64_t>> by_model;
  size_t tensors = 0;
  for (const model_params::Model& m : models) {
    for (const model_params::Tensor& t : m.tensors) by_model[m.name].push_back(t.numel * bytes_per_param);
    tensors += m.tensors.size();
  }
  for (const char* m : kHeadline)
    if (!by_model.count(m)) throw std::runtime_error(std::string("model '") + m + "' missing from " + path);

  std::printf("pins-bench alloc: %zu tensors from %s, %zu bytes/param\n\n", tensors, path.c_str(), bytes_per_param);
  std::printf("%-20s %8s %14s %14s %10s %14s %10s\n", "model", "tensors", "requested", "pool", "waste", "pow2",
              "waste");
  auto row = [](const std::string& name, const std::vector<uint64_t>& sizes) {
    Waste w;
    w.tensors = sizes.size();
    for (uint64_t n : sizes) {
      w.requested += n;
      w.pow2 += pow2_ceil(n);
    }
    w.pool_committed = pool_committed(sizes);
    std::printf("%-20s %8zu %14llu %14llu %10.4f %14llu %10.4f\n", name.c_str(), w.tensors,
                static_cast<unsigned long long>(w.requested), static_cast<unsigned long long>(w.pool_committed),
                double(w.pool_committed) / double(w.requested), static_cast<unsigned long long>(w.pow2),
                double(w.pow2) / double(w.requested));
    return w;
  };
  for (const model_params::Model& m : models) row(m.name, by_model[m.name]);
  std::vector<uint64_t> headline;
  std::string names;
  for (const char* m : kHeadline) {
    headline.insert(headline.end(), by_model[m].begin(), by_model[m].end());
    names += names.empty() ? m : std::string("+") + m;
  }
  std::printf("\nall four pinned together (%s):\n", names.c_str());
  const Waste all = row("headline", headline);

  // Latency: the SDXL UNet's sizes (1680 tensors from 640 B to 26 MB), allocated
  // in order and freed, against a warm pool (extents committed by a first pass)
  // and against malloc+free. Both touch no memory.
  const std::vector<uint64_t>& sizes = by_model["sdxl_unet"];
  PoolOptions o = pool_options(Config{});
  o.retain_free = ~size_t{0};
  HostPool pool(make_null_backend(), o);
  std::vector<void*> ptrs(sizes.size());
  auto pool_pass = [&] {
    for (size_t i = 0; i < sizes.size(); ++i) ptrs[i] = pool.allocate(sizes[i]);
    for (void* p : ptrs) pool.free(p);
  };
  pool_pass();  // warm up: commit the extents once
  const int64_t commits_before = pool.stats().commits;
  auto malloc_pass = [&] {
    for (size_t i = 0; i < sizes.size(); ++i) ptrs[i] = std::malloc(sizes[i]);
    for (void* p : ptrs) std::free(p);
  };
  const double t_malloc = best_seconds(reps, malloc_pass);
  const double t_pool = best_seconds(reps, pool_pass);
  if (pool.stats().commits != commits_before) throw std::runtime_error("the warm pool committed again");
  const double ratio = t_pool / t_malloc;
  std::printf("\nwarm allocate+free of %zu sizes, best of %d: pool %.1f us, malloc %.1f us (ratio %.3f)\n",
              sizes.size(), reps, t_pool * 1e6, t_malloc * 1e6, ratio);
  std::printf("RESULT waste_pool=%.4f waste_pow2=%.4f alloc_latency_ratio=%.3f\n",
              double(all.pool_committed) / double(all.requested), double(all.pow2) / double(all.requested), ratio);
  return 0;
}

}  // namespace pins::bench
