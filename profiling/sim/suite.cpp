#include "profiling/sim/suite.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "csrc/base/size.h"
#include "profiling/sim/expand.h"
#include "profiling/sim/report.h"

namespace pins::sim {

using json = nlohmann::json;

const char* to_string(Pattern p) {
  switch (p) {
    case Pattern::Rerun: return "rerun";
    case Pattern::SeedPrompt: return "seed-prompt";
    case Pattern::LoraSwap: return "lora-swap";
    case Pattern::OneOff: return "one-off";
    case Pattern::TwoAlternating: return "two-alternating";
    case Pattern::TwoInterleaved: return "two-interleaved";
    case Pattern::ThreeAlternating: return "three-alternating";
    case Pattern::ThreeInterleaved: return "three-interleaved";
  }
  return "?";
}

Pattern pattern_of(int index) {
  static constexpr Pattern kSchedule[kScheduleLength] = {
      Pattern::Rerun,          Pattern::SeedPrompt,       Pattern::LoraSwap,        Pattern::SeedPrompt,
      Pattern::OneOff,         Pattern::TwoAlternating,   Pattern::SeedPrompt,      Pattern::TwoInterleaved,
      Pattern::ThreeAlternating, Pattern::ThreeInterleaved};
  return kSchedule[index % kScheduleLength];
}

namespace {

// A model a family uses: from the parameter list, or `params` parameters in
// `layer_count` equal layers where the list has no such model.
struct ModelSpec {
  const char* key;
  const char* params_name;  // nullptr: sized
  double params = 0;        // sized: parameter count
  int layer_count = 0;
  double inference_gib = 0;
  bool scalable = true;  // may be stored at 1 byte per parameter (fp8)
};

const ModelSpec kSpecs[] = {
    {"umt5", "umt5xxl_encoder", 0, 0, 1.0},
    {"wan22_high", "wan21_14b", 0, 0, 4.0},
    {"wan22_low", "wan21_14b", 0, 0, 4.0},
    {"wan21", "wan21_14b", 0, 0, 4.0},
    {"wan_vae", "wan21_vae", 0, 0, 6.0, false},
    {"clip_l", "clip_l", 0, 0, 0.3, false},
    {"clip_g", "clip_g", 0, 0, 0.5, false},
    {"t5xxl", "t5xxl_encoder", 0, 0, 1.0},
    {"flux", "flux1_dev", 0, 0, 2.0},
    {"flux_vae", "flux_vae", 0, 0, 1.5, false},
    {"sdxl_unet", "sdxl_unet", 0, 0, 1.0},
    {"sdxl_refiner", "sdxl_refiner_unet", 0, 0, 1.0},
    {"sdxl_vae", "sdxl_vae", 0, 0, 1.0, false},
    {"sd35", nullptr, 8.1e9, 38, 2.0},
    {"dit20b", nullptr, 20.4e9, 60, 3.0},
    {"vl7b", nullptr, 7.1e9, 28, 1.0},
    {"small2b", nullptr, 2.0e9, 24, 1.0},
};

// A workflow shape: encoders, then samplers (two experts split the steps),
// then the VAE decode.
struct Family {
  const char* name;
  std::vector<const char*> encoders, samplers;
  const char* vae;
  std::vector<int> steps;  // drawn from
};

const Family kFamilies[] = {
    {"wan22", {"umt5"}, {"wan22_high", "wan22_low"}, "wan_vae", {4, 6, 8, 20, 20, 30}},
    {"wan21", {"umt5"}, {"wan21"}, "wan_vae", {4, 8, 20, 30}},
    {"flux", {"clip_l", "t5xxl"}, {"flux"}, "flux_vae", {4, 8, 20, 25, 30}},
    {"sdxl", {"clip_l", "clip_g"}, {"sdxl_unet"}, "sdxl_vae", {20, 25, 30, 40}},
    {"sdxl_refiner", {"clip_l", "clip_g"}, {"sdxl_unet", "sdxl_refiner"}, "sdxl_vae", {25, 30, 40}},
    {"sd35", {"clip_l", "clip_g", "t5xxl"}, {"sd35"}, "flux_vae", {20, 28, 40}},
    {"dit20b", {"vl7b"}, {"dit20b"}, "wan_vae", {8, 20, 30, 50}},
    {"small2b", {"clip_l"}, {"small2b"}, "sdxl_vae", {4, 6, 8}},
};

const ModelSpec& spec(const std::string& key) {
  for (const ModelSpec& s : kSpecs)
    if (key == s.key) return s;
  throw std::logic_error("suite: no model spec " + key);
}

constexpr int kStyles = 3;  // LoRA styles per sampler model

struct Workflow {
  int family = 0;
  int bpp = 2;
  int steps = 20;
  unsigned styles = 0;  // LoRA styles applied (bit j: style j)
};

// One run of the sequence.
struct RunSpec {
  int workflow = 0;
  bool full = true;
  unsigned styles = 0;
  // Its prompt in the trace: one per workflow, encoders or not, and LoRA styles.
  std::string prompt() const {
    return "w" + std::to_string(workflow) + (full ? "_full" : "_seed") + "_l" + std::to_string(styles);
  }
};

class Generator {
 public:
  Generator(uint64_t seed, int index, const std::vector<model_params::Model>& params)
      : params_(params) {
    std::seed_seq ss{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(index),
                     0x5u};
    rng_.seed(ss);
  }

  Scenario make(uint64_t seed, int index) {
    Scenario s;
    s.seed = seed;
    s.index = index;
    s.pattern = pattern_of(index);
    const int ram_gib = pick<int>({16, 24, 32, 32, 48, 64, 64, 96, 128});
    // Machines with more VRAM than RAM are rare among the ones pins is for.
    std::vector<int> vrams;
    for (const int v : {8, 12, 12, 16, 16, 24, 24, 32, 48})
      if (v <= ram_gib) vrams.push_back(v);
    const int vram_gib = pick<int>(vrams);
    const int other_mib = 3072 + 512 * uniform(0, 6);
    json machine = {{"ram", std::to_string(ram_gib) + "GiB"},
                    {"vram", std::to_string(vram_gib) + "GiB"},
                    {"disk_read_bw", pick<std::string>({"1.5GB/s", "3GB/s", "7GB/s"})},
                    {"ram_copy_bw", "10GB/s"},
                    {"h2d_bw", vram_gib >= 32 ? "50GB/s" : "25GB/s"},
                    {"other_ram", std::to_string(other_mib) + "MiB"},
                    {"swap", 0},
                    {"vram_reserve", "1.5GiB"}};

    const int n_workflows = s.pattern == Pattern::OneOff || s.pattern == Pattern::TwoAlternating ||
                                    s.pattern == Pattern::TwoInterleaved
                                ? 2
                            : s.pattern == Pattern::ThreeAlternating || s.pattern == Pattern::ThreeInterleaved ? 3
                                                                                                               : 1;
    for (int w = 0; w < n_workflows; ++w) {
      Workflow wf;
      wf.family = uniform(0, static_cast<int>(std::size(kFamilies)) - 1);
      wf.bpp = uniform(0, 2) == 0 ? 1 : 2;
      wf.steps = pick(kFamilies[wf.family].steps);
      wf.styles = random_styles();
      workflows_.push_back(wf);
    }
    const std::vector<RunSpec> runs = plan_runs(s.pattern);

    json models = json::array(), loras = json::array(), prompts = json::array();
    std::string families;
    for (const Workflow& wf : workflows_) families += std::string(families.empty() ? "" : "+") + kFamilies[wf.family].name;
    std::vector<std::string> prompt_names;
    for (const RunSpec& r : runs) {
      const Workflow& wf = workflows_[r.workflow];
      const Family& fam = kFamilies[wf.family];
      const std::string pname = r.prompt();
      if (std::find(prompt_names.begin(), prompt_names.end(), pname) == prompt_names.end()) {
        json steps = json::array();
        if (r.full)
          for (const char* e : fam.encoders) steps.push_back({{"model", model(spec(e), wf, models)}});
        const int n = static_cast<int>(fam.samplers.size());
        for (int i = 0; i < n; ++i) {
          const ModelSpec& sp = spec(fam.samplers[i]);
          const std::string m = model(sp, wf, models);
          // Two experts split the steps; the refiner takes the last fifth.
          const int first = fam.samplers.size() == 1 ? wf.steps
                            : std::string(fam.name) == "sdxl_refiner" ? wf.steps - wf.steps / 5
                                                                      : wf.steps / 2;
          json step = {{"model", m}, {"steps", i == 0 ? first : wf.steps - first}};
          json ls = json::array();
          for (int j = 0; j < kStyles; ++j)
            if (r.styles & (1u << j)) ls.push_back(lora(sp, m, j, loras));
          if (!ls.empty()) step["loras"] = ls;
          steps.push_back(step);
        }
        steps.push_back({{"model", model(spec(fam.vae), wf, models)}});
        prompts.push_back({{"name", pname}, {"steps", steps}});
        prompt_names.push_back(pname);
      }
    }
    json seq_prompts = json::array();
    for (const RunSpec& r : runs) seq_prompts.push_back(r.prompt());
    s.name = "s" + std::to_string(seed) + "-" + std::to_string(index) + "-" + to_string(s.pattern) + "-" +
             std::to_string(ram_gib) + "g-" + std::to_string(vram_gib) + "g-" + families;
    json doc = {{"name", s.name},
                {"description", "generated by pins-sim --suite (Note [Simulator suite])"},
                {"machine", machine},
                {"models", models},
                {"loras", loras},
                {"prompts", prompts},
                {"sequences",
                 {{{"name", to_string(s.pattern)},
                   {"prompts", seq_prompts},
                   {"repeat_from", 0},
                   {"runs", static_cast<int>(runs.size())}}}}};
    if (loras.empty()) doc.erase("loras");
    s.json = doc.dump(2);
    s.trace = parse_trace(s.json, s.name, "");
    return s;
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T>
  T pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(uniform(0, static_cast<int>(v.size()) - 1))];
  }
  unsigned random_styles() {
    unsigned m = 0;
    const int n = uniform(0, 2);
    while (__builtin_popcount(m) < n) m |= 1u << uniform(0, kStyles - 1);
    return m;
  }

  // The runs of a pattern (Note [Simulator suite]).
  std::vector<RunSpec> plan_runs(Pattern p) {
    const int nw = static_cast<int>(workflows_.size());
    const int n = nw == 3 ? uniform(8, 12) : uniform(6, 10);
    std::vector<int> order(n, 0);
    switch (p) {
      case Pattern::OneOff: {
        const int times = uniform(1, 2);
        for (int k = 0; k < times; ++k) order[uniform(1, n - 2)] = 1;
        break;
      }
      case Pattern::TwoAlternating:
      case Pattern::ThreeAlternating:
        for (int i = 0; i < n; ++i) order[i] = i % nw;
        break;
      case Pattern::TwoInterleaved:
      case Pattern::ThreeInterleaved: {
        for (int i = 1; i < n; ++i) order[i] = uniform(0, nw - 1);
        for (int w = 1; w < nw; ++w)  // every workflow runs at least twice
          while (std::count(order.begin(), order.end(), w) < 2) order[uniform(1, n - 1)] = w;
        break;
      }
      default: break;
    }
    std::vector<RunSpec> runs;
    std::vector<unsigned> styles;
    for (const Workflow& wf : workflows_) styles.push_back(wf.styles);
    for (int i = 0; i < n; ++i) {
      RunSpec r;
      r.workflow = order[i];
      const bool same = i > 0 && order[i - 1] == order[i];
      if (p == Pattern::LoraSwap && i > 0 && chance(0.6)) {
        unsigned next = styles[r.workflow];
        while (next == styles[r.workflow]) next = random_styles();
        styles[r.workflow] = next;
      }
      r.styles = styles[r.workflow];
      r.full = !same || p == Pattern::Rerun || chance(p == Pattern::LoraSwap ? 0.3 : 0.45);
      runs.push_back(r);
    }
    return runs;
  }

  // The model's name in the trace, adding it on first use: one per spec and
  // precision (Note [Simulator suite]: workflows of a family share models).
  std::string model(const ModelSpec& sp, const Workflow& wf, json& models) {
    const int bpp = sp.scalable ? wf.bpp : 2;
    const std::string name = std::string(sp.key) + (bpp == 1 ? "_fp8" : "");
    for (const json& m : models)
      if (m["name"] == name) return name;
    json m = {{"name", name}, {"inference_bytes", static_cast<uint64_t>(sp.inference_gib * GiB)}};
    if (sp.params_name) {
      json layers = json::array();
      for (const Layer& l : group_layers(listed(sp).tensors, "block", bpp, GiB))
        layers.push_back({{"name", l.name}, {"bytes", l.bytes}});
      m["layers"] = layers;
    } else {
      m["bytes"] = static_cast<uint64_t>(sp.params * bpp);
      m["layer_count"] = sp.layer_count;
    }
    models.push_back(m);
    return name;
  }

  // The parameter list's model of a spec that names one.
  const model_params::Model& listed(const ModelSpec& sp) const {
    const model_params::Model* m = model_params::find(params_, sp.params_name);
    if (m == nullptr) throw std::runtime_error(std::string("suite: the parameter list has no ") + sp.params_name);
    return *m;
  }

  // LoRA style j of model `m` (of spec `sp`): rank 16-64, 0.5-3% of its
  // parameters, in fp16 whatever the model's precision (2 bytes a parameter).
  std::string lora(const ModelSpec& sp, const std::string& m, int j, json& loras) {
    const std::string name = m + "_style" + std::to_string(j);
    for (const json& l : loras)
      if (l["name"] == name) return name;
    double params = sp.params;
    if (sp.params_name)
      for (const model_params::Tensor& t : listed(sp).tensors) params += static_cast<double>(t.numel);
    const auto bytes =
        static_cast<uint64_t>(2 * params * (0.005 + 0.025 * std::uniform_real_distribution<double>(0, 1)(rng_)));
    loras.push_back({{"name", name}, {"model", m}, {"bytes", bytes}});
    return name;
  }

  const std::vector<model_params::Model>& params_;
  std::mt19937_64 rng_;
  std::vector<Workflow> workflows_;
};

SuiteRow replay_scenario(const Scenario& s, const std::vector<std::string>& policies, const ReplayOptions& o) {
  const Sequence& seq = s.trace.sequences.front();
  const Expansion e = expand(s.trace, seq, seq.runs);
  SuiteRow row;
  row.runs = seq.runs - 1;
  row.allowance = s.trace.largest_layer() * static_cast<uint64_t>(row.runs);
  row.ram_bound = window_bound(e, 1, row.runs, /*ram=*/true);
  for (const std::string& p : policies) {
    const PolicyResult r = replay(s.trace, seq, e, p, o);
    uint64_t disk = 0;
    for (size_t i = 1; i < r.runs.size(); ++i) disk += r.runs[i].disk_bytes;
    row.disk.push_back(disk);
    if (p == "oracle")
      row.thrashing = row.runs > 0 && disk / static_cast<uint64_t>(row.runs) > s.trace.machine.ram;
  }
  return row;
}

// num / den; with den 0: infinity, or 1 when num is 0 too.
double ratio(double num, double den) { return den > 0 ? num / den : (num > 0 ? INFINITY : 1.0); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

Scenario make_scenario(uint64_t seed, int index, const std::vector<model_params::Model>& params) {
  return Generator(seed, index, params).make(seed, index);
}

int SuiteResult::policy_index(const std::string& p) const {
  const auto it = std::find(policies.begin(), policies.end(), p);
  return it == policies.end() ? -1 : static_cast<int>(it - policies.begin());
}

SuiteResult run_suite(uint64_t seed, int count, const std::vector<std::string>& policies,
                      const std::vector<model_params::Model>& params, const ReplayOptions& options, int threads) {
  SuiteResult r;
  r.seed = seed;
  r.policies = policies;
  r.policies.erase(std::remove(r.policies.begin(), r.policies.end(), "oracle"), r.policies.end());
  r.policies.push_back("oracle");
  r.scenarios.resize(static_cast<size_t>(count));
  r.rows.resize(static_cast<size_t>(count));
  std::atomic<int> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(std::max(threads, 1)));
  const auto work = [&](int t) {
    try {
      for (int i = next++; i < count; i = next++) {
        r.scenarios[i] = make_scenario(seed, i, params);
        r.rows[i] = replay_scenario(r.scenarios[i], r.policies, options);
      }
    } catch (...) {
      errors[t] = std::current_exception();
      next = count;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(threads, 1); ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return r;
}

std::vector<SuiteFigures> suite_figures(const SuiteResult& r) {
  const int oracle = r.policy_index("oracle"), mru = r.policy_index("mru"), lru = r.policy_index("lru");
  std::vector<SuiteFigures> out;
  double oracle_total = 0, oracle_steady = 0;
  for (const SuiteRow& row : r.rows) {
    oracle_total += static_cast<double>(row.disk[oracle]);
    if (!row.thrashing) oracle_steady += static_cast<double>(row.disk[oracle]);
  }
  for (size_t p = 0; p < r.policies.size(); ++p) {
    SuiteFigures f;
    f.policy = r.policies[p];
    std::vector<double> ratios;
    double steady = 0;
    for (size_t i = 0; i < r.rows.size(); ++i) {
      const SuiteRow& row = r.rows[i];
      const double d = static_cast<double>(row.disk[p]), o = static_cast<double>(row.disk[oracle]);
      const double allowance = std::max(1.0, static_cast<double>(row.allowance));
      f.total += d;
      if (row.thrashing) f.thrashing++;
      else steady += d;
      if (row.disk[p] < row.ram_bound) f.below_ram_bound++;
      if (row.disk[p] < row.disk[oracle]) f.below_oracle++;
      if (row.disk[oracle] > 0) {
        f.oracle_reads++;
        ratios.push_back(d / o);
        if (d / o > f.worst) {
          f.worst = d / o;
          f.worst_scenario = static_cast<int>(i);
        }
      } else {
        f.oracle_zero_excess = std::max(f.oracle_zero_excess, d);
        if (row.disk[p] > row.allowance) f.oracle_zero_over++;
      }
      const auto over = [&](int other, int& count, double& worst) {
        if (other < 0) return;
        const double excess = d - static_cast<double>(row.disk[other]);
        if (excess > static_cast<double>(row.allowance)) count++;
        worst = std::max(worst, excess / allowance);
      };
      over(mru, f.over_mru, f.worst_over_mru);
      over(lru, f.over_lru, f.worst_over_lru);
      if (mru >= 0 && lru >= 0) {
        const double excess = d - static_cast<double>(std::min(row.disk[mru], row.disk[lru]));
        if (excess > static_cast<double>(row.allowance)) f.over_min++;
        f.worst_over_min = std::max(f.worst_over_min, excess / allowance);
      }
    }
    f.vs_oracle = ratio(f.total, oracle_total);
    f.vs_oracle_steady = ratio(steady, oracle_steady);
    f.median = quantile(ratios, 0.5);
    f.p90 = quantile(ratios, 0.9);
    out.push_back(f);
  }
  return out;
}

bool meets_targets(const SuiteFigures& f) {
  return f.vs_oracle <= 1.10 && f.worst <= 1.25 && f.over_mru == 0 && f.over_lru == 0 && f.oracle_zero_over == 0;
}

void print_suite(std::ostream& os, const SuiteResult& r, const std::string& default_policy) {
  const std::vector<SuiteFigures> figs = suite_figures(r);
  const int oracle = r.policy_index("oracle");
  char line[512];
  os << "pins-sim --suite: seed " << r.seed << ", " << r.scenarios.size()
     << " scenarios; disk bytes over the runs after each scenario's first\n\n";
  os << "(x oracle*: the same without the " << (figs.empty() ? 0 : figs.front().thrashing)
     << " thrashing scenarios, where the oracle reads more than RAM a run; >mru+1L, >lru+1L, >min+1L:\n"
        " scenarios reading more than mru, lru or the lesser of the two + one largest layer per run;\n"
        " max>mru, max>lru, max>min: the most bytes over them, in largest layers per run; o=0, >1L:\n"
        " scenarios where the oracle reads nothing and the policy more than a layer per run)\n";
  std::snprintf(line, sizeof line, "%-12s %10s %9s %9s %7s %7s %7s  %-22s %9s %9s %9s %11s %8s %8s %8s\n", "policy",
                "disk GiB", "x oracle", "x oracle*", "median", "p90", "worst", "worst scenario", ">mru+1L", ">lru+1L",
                ">min+1L", "o=0, >1L", "max>mru", "max>lru", "max>min");
  os << line;
  for (const SuiteFigures& f : figs) {
    const std::string worst = f.worst_scenario >= 0 ? std::to_string(f.worst_scenario) + " " +
                                                          to_string(r.scenarios[f.worst_scenario].pattern)
                                                    : "-";
    std::snprintf(
        line, sizeof line, "%-12s %10.1f %9.3f %9.3f %7.3f %7.3f %7.3f  %-22s %9d %9d %9d %11d %8.1f %8.1f %8.1f\n",
        f.policy.c_str(), f.total / GiB, f.vs_oracle, f.vs_oracle_steady, f.median, f.p90, f.worst, worst.c_str(),
        f.over_mru, f.over_lru, f.over_min, f.oracle_zero_over, f.worst_over_mru, f.worst_over_lru, f.worst_over_min);
    os << line;
  }
  const int d = r.policy_index(default_policy);
  if (d < 0) return;
  // Per pattern: each policy's disk over the oracle's.
  os << "\nper pattern, disk / the oracle's disk:\n";
  std::snprintf(line, sizeof line, "  %-18s", "pattern");
  os << line;
  for (const std::string& p : r.policies) {
    std::snprintf(line, sizeof line, " %11s", p.c_str());
    os << line;
  }
  os << "\n";
  for (int pat = 0; pat < kPatternCount; ++pat) {
    std::snprintf(line, sizeof line, "  %-18s", to_string(static_cast<Pattern>(pat)));
    os << line;
    for (size_t p = 0; p < r.policies.size(); ++p) {
      double dd = 0, od = 0;
      for (size_t i = 0; i < r.rows.size(); ++i)
        if (static_cast<int>(r.scenarios[i].pattern) == pat) {
          dd += static_cast<double>(r.rows[i].disk[p]);
          od += static_cast<double>(r.rows[i].disk[oracle]);
        }
      std::snprintf(line, sizeof line, " %11.3f", ratio(dd, od));
      os << line;
    }
    os << "\n";
  }
  // The five scenarios where it is farthest from the oracle.
  std::vector<int> idx;
  for (size_t i = 0; i < r.rows.size(); ++i) idx.push_back(static_cast<int>(i));
  const auto excess = [&](int i) {
    return static_cast<double>(r.rows[i].disk[d]) - static_cast<double>(r.rows[i].disk[oracle]);
  };
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return excess(a) > excess(b); });
  os << "\nmost bytes over the oracle (" << default_policy << "):\n";
  for (size_t k = 0; k < std::min<size_t>(5, idx.size()); ++k) {
    const int i = idx[k];
    std::string per;
    for (size_t p = 0; p < r.policies.size(); ++p)
      per += " " + r.policies[p] + " " + gib(static_cast<double>(r.rows[i].disk[p]), 1);
    os << "  " << r.scenarios[i].name << ":" << per << " GiB\n";
  }
  const SuiteFigures& f = figs[static_cast<size_t>(d)];
  std::snprintf(line, sizeof line,
                "RESULT policy=%s seed=%llu scenarios=%zu vs_oracle=%.3f vs_oracle_steady=%.3f thrashing=%d "
                "median=%.3f p90=%.3f worst=%.3f over_mru=%d over_lru=%d over_min=%d worst_over_mru_layers=%.1f "
                "worst_over_lru_layers=%.1f worst_over_min_layers=%.1f oracle_zero_over=%d "
                "below_oracle=%d below_ram_bound=%d targets=%s\n",
                default_policy.c_str(), static_cast<unsigned long long>(r.seed), r.scenarios.size(), f.vs_oracle,
                f.vs_oracle_steady, f.thrashing, f.median, f.p90, f.worst, f.over_mru, f.over_lru, f.over_min,
                f.worst_over_mru, f.worst_over_lru, f.worst_over_min, f.oracle_zero_over, f.below_oracle,
                f.below_ram_bound, meets_targets(f) ? "met" : "missed");
  os << line;
}

void write_suite_csv(std::ostream& os, const SuiteResult& r) {
  os << "seed,scenario,name,pattern,policy,disk_bytes,oracle_bytes,ram_bound_bytes,allowance_bytes,runs\n";
  const int oracle = r.policy_index("oracle");
  for (size_t i = 0; i < r.rows.size(); ++i)
    for (size_t p = 0; p < r.policies.size(); ++p)
      os << r.seed << ',' << i << ',' << r.scenarios[i].name << ',' << to_string(r.scenarios[i].pattern) << ','
         << r.policies[p] << ',' << r.rows[i].disk[p] << ',' << r.rows[i].disk[oracle] << ',' << r.rows[i].ram_bound
         << ',' << r.rows[i].allowance << ',' << r.rows[i].runs << '\n';
}

}  // namespace pins::sim
