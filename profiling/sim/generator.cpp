// The scenario suite's generator (Note [Simulator suite] in suite.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "csrc/base/size.h"
#include "profiling/sim/catalogue.h"
#include "profiling/sim/expand.h"
#include "profiling/sim/suite.h"

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
    case Pattern::AppearRepeat: return "appear-repeat";
    case Pattern::NewTextPairs: return "new-text-pairs";
    case Pattern::EncoderPairs: return "encoder-pairs";
    case Pattern::ThreeSamplers: return "three-samplers";
  }
  return "?";
}

const char* to_string(SuiteKind k) {
  switch (k) {
    case SuiteKind::Suite: return "suite";
    case SuiteKind::SuiteV1: return "v1";
    case SuiteKind::Unseen: return "unseen";
  }
  return "?";
}

std::optional<SuiteKind> parse_suite_kind(const std::string& s) {
  for (SuiteKind k : {SuiteKind::Suite, SuiteKind::SuiteV1, SuiteKind::Unseen})
    if (s == to_string(k)) return k;
  return std::nullopt;
}

namespace {
using P = Pattern;
// The suite's schedule before issue 39, and the first ten of today's.
const std::vector<Pattern> kScheduleV1 = {P::Rerun,          P::SeedPrompt,     P::LoraSwap,   P::SeedPrompt,
                                          P::OneOff,         P::TwoAlternating, P::SeedPrompt, P::TwoInterleaved,
                                          P::ThreeAlternating, P::ThreeInterleaved};
const std::vector<Pattern> kSchedule = {P::Rerun,          P::SeedPrompt,       P::LoraSwap,     P::SeedPrompt,
                                        P::OneOff,         P::TwoAlternating,   P::SeedPrompt,   P::TwoInterleaved,
                                        P::ThreeAlternating, P::ThreeInterleaved, P::AppearRepeat, P::NewTextPairs,
                                        P::EncoderPairs,   P::ThreeSamplers};
// Note [Simulator unseen sets]: the shapes issue 39 describes, weighted alike.
const std::vector<Pattern> kScheduleUnseen = {P::AppearRepeat, P::OneOff,       P::TwoAlternating, P::SeedPrompt,
                                              P::EncoderPairs, P::NewTextPairs, P::TwoInterleaved, P::ThreeSamplers};
const std::vector<Pattern>& schedule(SuiteKind kind) {
  return kind == SuiteKind::SuiteV1 ? kScheduleV1 : kind == SuiteKind::Unseen ? kScheduleUnseen : kSchedule;
}
}  // namespace

int schedule_length(SuiteKind kind) { return static_cast<int>(schedule(kind).size()); }

Pattern pattern_of(int index, SuiteKind kind) {
  const std::vector<Pattern>& s = schedule(kind);
  return s[static_cast<size_t>(index) % s.size()];
}

namespace {

const ModelSpec& spec(const std::string& key) { return model_spec(key); }

constexpr int kStyles = 3;  // LoRA styles per sampler model

struct Workflow {
  int family = 0;
  int bpp = 2;
  int enc_bpp = 2;  // the encoders' (encoder-pairs: the other workflow's differs)
  int steps = 20;
  unsigned styles = 0;  // LoRA styles applied (bit j: style j)
};

// One run of the sequence.
struct RunSpec {
  int workflow = 0;
  bool full = true;
  bool chain = false;  // three-samplers: every workflow in order, in one prompt
  unsigned styles = 0;
  // Its prompt in the trace: one per workflow, encoders or not, and LoRA styles.
  std::string prompt() const {
    return (chain ? std::string("chain") : "w" + std::to_string(workflow)) + (full ? "_full" : "_seed") + "_l" +
           std::to_string(styles);
  }
};

bool has_scalable_encoder(const Family& f) {
  for (const char* e : f.encoders)
    if (model_spec(e).scalable) return true;
  return false;
}

class Generator {
 public:
  Generator(uint64_t seed, int index, const std::vector<model_params::Model>& params, SuiteKind kind)
      : params_(params), kind_(kind), families_(kind == SuiteKind::Unseen ? unseen_families() : suite_families()) {
    std::seed_seq ss{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(index),
                     kind == SuiteKind::Unseen ? 0x39u : 0x5u};
    rng_.seed(ss);
  }

  Scenario make(uint64_t seed, int index) {
    Scenario s;
    s.seed = seed;
    s.index = index;
    s.pattern = pattern_of(index, kind_);
    const bool unseen = kind_ == SuiteKind::Unseen;
    // Note [Simulator unseen sets]: 8-128 GiB machines.
    const int ram_gib = unseen ? pick<int>({8, 12, 16, 24, 32, 32, 48, 64, 64, 96, 128})
                               : pick<int>({16, 24, 32, 32, 48, 64, 64, 96, 128});
    // Machines with more VRAM than RAM are rare among the ones pins is for.
    std::vector<int> vrams;
    for (const int v : unseen ? std::vector<int>{6, 8, 8, 12, 12, 16, 16, 24, 24, 32}
                              : std::vector<int>{8, 12, 12, 16, 16, 24, 24, 32, 48})
      if (v <= ram_gib) vrams.push_back(v);
    const int vram_gib = pick<int>(vrams);
    int other_mib = 3072 + 512 * uniform(0, 6);
    if (unseen) other_mib = std::min(other_mib, ram_gib * 512);  // at most half of a small machine
    json machine = {{"ram", std::to_string(ram_gib) + "GiB"},
                    {"vram", std::to_string(vram_gib) + "GiB"},
                    {"disk_read_bw", pick<std::string>({"1.5GB/s", "3GB/s", "7GB/s"})},
                    {"ram_copy_bw", "10GB/s"},
                    {"h2d_bw", vram_gib >= 32 ? "50GB/s" : "25GB/s"},
                    {"other_ram", std::to_string(other_mib) + "MiB"},
                    {"swap", 0},
                    {"vram_reserve", "1.5GiB"}};

    const Pattern p = s.pattern;
    const int n_workflows = p == P::OneOff || p == P::TwoAlternating || p == P::TwoInterleaved || p == P::NewTextPairs
                                ? 2
                            : p == P::ThreeAlternating || p == P::ThreeInterleaved || p == P::AppearRepeat ||
                                    p == P::ThreeSamplers
                                ? 3
                                : 1;
    for (int w = 0; w < n_workflows; ++w) {
      Workflow wf;
      wf.family = uniform(0, static_cast<int>(families_.size()) - 1);
      wf.bpp = uniform(0, 2) == 0 ? 1 : 2;
      wf.steps = pick(families_[wf.family].steps);
      wf.styles = random_styles();
      wf.enc_bpp = wf.bpp;
      // Three diffusion models in one prompt: three families.
      if (p == P::ThreeSamplers) {
        while (std::any_of(workflows_.begin(), workflows_.end(), [&](const Workflow& o) { return o.family == wf.family; }))
          wf.family = uniform(0, static_cast<int>(families_.size()) - 1);
        wf.steps = pick(families_[wf.family].steps);
      }
      workflows_.push_back(wf);
    }
    if (p == P::EncoderPairs) {
      // One sampler, its encoder in two precisions (two files: two models).
      Workflow& wf = workflows_.front();
      while (!has_scalable_encoder(families_[wf.family])) wf.family = uniform(0, static_cast<int>(families_.size()) - 1);
      wf.steps = pick(families_[wf.family].steps);
      Workflow other = wf;
      other.enc_bpp = 3 - wf.enc_bpp;
      workflows_.push_back(other);
    }
    const std::vector<RunSpec> runs = plan_runs(p);

    json models = json::array(), loras = json::array(), prompts = json::array();
    std::string families;
    for (size_t w = 0; w < workflows_.size(); ++w) {
      if (p == P::EncoderPairs && w > 0) break;  // the same family
      families += std::string(families.empty() ? "" : "+") + families_[workflows_[w].family].name;
    }
    std::vector<std::string> prompt_names;
    for (const RunSpec& r : runs) {
      const std::string pname = r.prompt();
      if (std::find(prompt_names.begin(), prompt_names.end(), pname) != prompt_names.end()) continue;
      json steps = json::array();
      for (int w = r.chain ? 0 : r.workflow; w <= (r.chain ? static_cast<int>(workflows_.size()) - 1 : r.workflow); ++w)
        add_steps(workflows_[w], r, steps, models, loras);
      prompts.push_back({{"name", pname}, {"steps", steps}});
      prompt_names.push_back(pname);
    }
    json seq_prompts = json::array();
    for (const RunSpec& r : runs) seq_prompts.push_back(r.prompt());
    s.name = std::string(kind_ == SuiteKind::SuiteV1 ? "v1-s" : unseen ? "u" : "s") + std::to_string(seed) + "-" + std::to_string(index) + "-" + to_string(s.pattern) + "-" +
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
  // One workflow's nodes in a run: its encoders (a full run), its samplers with
  // the run's LoRA styles, its VAE decode.
  void add_steps(const Workflow& wf, const RunSpec& r, json& steps, json& models, json& loras) {
    const Family& fam = families_[wf.family];
    if (r.full)
      for (const char* e : fam.encoders) steps.push_back({{"model", model(spec(e), wf, models, wf.enc_bpp)}});
    const int n = static_cast<int>(fam.samplers.size());
    for (int i = 0; i < n; ++i) {
      const ModelSpec& sp = spec(fam.samplers[i]);
      const std::string m = model(sp, wf, models, wf.bpp);
      // Two experts split the steps; the refiner takes the last fifth.
      const int first = fam.samplers.size() == 1                      ? wf.steps
                        : std::string(fam.name) == "sdxl_refiner" ? wf.steps - wf.steps / 5
                                                                  : wf.steps / 2;
      json step = {{"model", m}, {"steps", i == 0 ? first : wf.steps - first}};
      json ls = json::array();
      for (int j = 0; j < kStyles; ++j)
        if (r.styles & (1u << j)) ls.push_back(lora(sp, m, j, loras));
      if (!ls.empty()) step["loras"] = ls;
      steps.push_back(step);
    }
    steps.push_back({{"model", model(spec(fam.vae), wf, models, wf.bpp)}});
  }

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
      case Pattern::AppearRepeat: {
        // Each workflow appears after the last and repeats: A A B C C C.
        const int a = uniform(1, 4), b = uniform(1, std::min(4, n - a - 1));
        for (int i = a; i < n; ++i) order[i] = i < a + b ? 1 : 2;
        break;
      }
      case Pattern::NewTextPairs:
      case Pattern::EncoderPairs:
        for (int i = 0; i < n; ++i) order[i] = (i / 2) % 2;
        break;
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
      if (p == Pattern::NewTextPairs || p == Pattern::EncoderPairs) {
        r.full = true;  // new text every prompt
      } else if (p == Pattern::ThreeSamplers) {
        r.chain = true;
        r.full = i == 0 || chance(0.7);  // the text changes most prompts
      } else {
        r.full = !same || p == Pattern::Rerun || chance(p == Pattern::LoraSwap ? 0.3 : 0.45);
      }
      runs.push_back(r);
    }
    return runs;
  }

  // The model's name in the trace, adding it on first use: one per spec and
  // precision (Note [Simulator suite]: workflows of a family share models).
  std::string model(const ModelSpec& sp, const Workflow&, json& models, int wf_bpp) {
    const int bpp = sp.scalable ? wf_bpp : 2;
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
  SuiteKind kind_;
  const std::vector<Family>& families_;
  std::mt19937_64 rng_;
  std::vector<Workflow> workflows_;
};
}  // namespace

Scenario make_scenario(uint64_t seed, int index, const std::vector<model_params::Model>& params, SuiteKind kind) {
  return Generator(seed, index, params, kind).make(seed, index);
}

}  // namespace pins::sim
