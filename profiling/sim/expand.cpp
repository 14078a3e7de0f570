#include "profiling/sim/expand.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "csrc/base/size.h"

namespace pins::sim {

Subset Access::subset() const {
  return target_subset(kind, resident, signature.has_value(), /*cache_allowed=*/true);
}

uint64_t weight_storage(int model, int layer) {
  return (static_cast<uint64_t>(model + 1) << 32) | static_cast<uint32_t>(layer);
}

uint64_t patch_storage(int lora, int layer) {
  return (1ull << 62) | (static_cast<uint64_t>(lora + 1) << 32) | static_cast<uint32_t>(layer);
}

std::string key_name(const Trace& t, const Access& a) {
  const std::string w = t.models[a.model].name + "/" + t.models[a.model].layers[a.layer].name;
  return a.lora < 0 ? w : "lora:" + t.loras[a.lora].name + "/" + w;
}

namespace {

// What VRAM holds of one model.
struct DeviceModel {
  std::vector<char> resident;
  uint64_t resident_bytes = 0;
  int64_t signature = 0;    // patch set applied to the resident layers; 0: none
  uint64_t loaded_seq = 0;  // larger: loaded more recently
};

int64_t signature_of(const std::vector<int>& loras) {
  if (loras.empty()) return 0;
  uint64_t h = 1469598103934665603ull;
  for (int l : loras) h = (h ^ static_cast<uint64_t>(l + 1)) * 1099511628211ull;
  return static_cast<int64_t>(h & 0x3fffffffffffffffull) | 1;
}

class Expander {
 public:
  Expander(const Trace& t) : t_(t), dev_(t.models.size()) {
    for (size_t i = 0; i < t.models.size(); ++i) dev_[i].resident.assign(t.models[i].layers.size(), 0);
  }

  void run(int run_index, const Prompt& p, Expansion& out) {
    RunPlan plan;
    plan.run = run_index;
    for (const Step& s : p.steps)
      if (std::find(plan.models.begin(), plan.models.end(), s.model) == plan.models.end())
        plan.models.push_back(s.model);
    run_ = run_index;
    out_ = &out;
    const size_t first = out.accesses.size();
    for (size_t i = 0; i < p.steps.size(); ++i) {
      StepPlan sp;
      sp.step = static_cast<int>(i);
      sp.model = p.steps[i].model;
      sp.passes = p.steps[i].steps;
      sp.begin = out.accesses.size();
      step(static_cast<int>(i), p.steps[i]);
      sp.end = out.accesses.size();
      sp.vram_used_after = vram_used();
      for (const DeviceModel& d : dev_) sp.device_after.push_back(d.resident_bytes);
      plan.steps.push_back(sp);
    }
    bound(plan, first, p);
    out.runs.push_back(std::move(plan));
  }

 private:
  uint64_t vram_used() const {
    uint64_t u = 0;
    for (const DeviceModel& d : dev_) u += d.resident_bytes;
    return u;
  }
  uint64_t vram_free() const {
    const uint64_t u = vram_used();
    return t_.machine.vram > u ? t_.machine.vram - u : 0;
  }

  void drop(int m, int layer) {
    DeviceModel& d = dev_[m];
    if (!d.resident[layer]) return;
    d.resident[layer] = 0;
    d.resident_bytes -= t_.models[m].layers[layer].bytes;
  }
  void unload(int m) {
    for (size_t i = 0; i < dev_[m].resident.size(); ++i) drop(m, static_cast<int>(i));
  }

  // ComfyUI free_memory(): other models give up VRAM until more than `target`
  // is free: the one with the most bytes already offloaded first, then the
  // smallest, then the most recently loaded; each partially (its smallest layers
  // first, until more than it was asked for is freed) when that suffices, else whole.
  void free_memory(double target, int keep) {
    std::vector<int> cands;
    for (size_t i = 0; i < dev_.size(); ++i)
      if (static_cast<int>(i) != keep && dev_[i].resident_bytes > 0) cands.push_back(static_cast<int>(i));
    std::sort(cands.begin(), cands.end(), [&](int a, int b) {
      const uint64_t oa = t_.models[a].bytes - dev_[a].resident_bytes, ob = t_.models[b].bytes - dev_[b].resident_bytes;
      if (oa != ob) return oa > ob;
      if (t_.models[a].bytes != t_.models[b].bytes) return t_.models[a].bytes < t_.models[b].bytes;
      return dev_[a].loaded_seq > dev_[b].loaded_seq;
    });
    for (int m : cands) {
      const double free = static_cast<double>(vram_free());
      if (free > target) break;
      const double to_free = target - free;
      DeviceModel& d = dev_[m];
      if (to_free < static_cast<double>(d.resident_bytes)) {
        std::vector<int> order;
        for (size_t i = 0; i < d.resident.size(); ++i)
          if (d.resident[i]) order.push_back(static_cast<int>(i));
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          const uint64_t sa = t_.models[m].layers[a].bytes, sb = t_.models[m].layers[b].bytes;
          return sa != sb ? sa < sb : a < b;
        });
        double freed = 0;
        for (int l : order) {
          if (to_free < freed) break;
          freed += static_cast<double>(t_.models[m].layers[l].bytes);
          drop(m, l);
        }
        if (freed >= to_free) continue;
      }
      unload(m);
    }
  }

  void emit(int step, int m, int layer, int lora, uint64_t bytes, bool resident, int64_t sig) {
    Access a;
    a.run = run_;
    a.step = step;
    a.model = m;
    a.layer = layer;
    a.lora = lora;
    a.bytes = bytes;
    a.resident = resident;
    if (lora < 0) {
      a.kind = Kind::Weights;
      a.storage = weight_storage(m, layer);
    } else {
      a.kind = Kind::Patches;
      a.storage = patch_storage(lora, layer);
      a.signature = sig;
    }
    out_->accesses.push_back(a);
  }

  // One weight and, when patched, its LoRA factors.
  void copy_layer(int step, const Step& s, int layer, bool resident, int64_t sig) {
    const int m = s.model;
    emit(step, m, layer, -1, t_.models[m].layers[layer].bytes, resident, 0);
    for (int l : s.loras)
      if (const uint64_t b = t_.loras[l].layer_bytes[layer]; b > 0) emit(step, m, layer, l, b, resident, sig);
  }

  void step(int step_index, const Step& s) {
    const int m = s.model;
    const Model& model = t_.models[m];
    DeviceModel& d = dev_[m];
    const int64_t sig = signature_of(s.loras);
    // A new patch set: ComfyUI restores the unpatched weights and loads again.
    if (d.signature != sig) {
      unload(m);
      d.signature = sig;
    }
    const double reserve = static_cast<double>(t_.machine.vram_reserve);
    const double minimum = reserve + static_cast<double>(model.inference_bytes);
    const bool complete = d.resident_bytes == model.bytes;
    if (!complete) {
      free_memory(1.1 * static_cast<double>(model.bytes - d.resident_bytes) + minimum, m);
      const double f = static_cast<double>(vram_free() + d.resident_bytes);
      const double budget = std::max({128.0 * MiB, f - minimum, std::min(0.4 * f, f - reserve)});
      std::vector<char> want(model.layers.size(), 0);
      if (budget > static_cast<double>(model.bytes)) {
        std::fill(want.begin(), want.end(), 1);
      } else {
        // comfy/model_patcher.py load(): largest first; a layer stays on the
        // device while the running total stays under the budget.
        std::vector<int> order(model.layers.size());
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          const uint64_t sa = model.layers[a].bytes, sb = model.layers[b].bytes;
          return sa != sb ? sa > sb : a > b;
        });
        double counter = 0;
        for (int l : order) {
          const double sz = static_cast<double>(model.layers[l].bytes);
          if (counter + sz < budget) {
            want[l] = 1;
            counter += sz;
          }
        }
      }
      std::vector<int> load;
      for (size_t l = 0; l < want.size(); ++l) {
        if (!want[l]) drop(m, static_cast<int>(l));
        else if (!d.resident[l]) load.push_back(static_cast<int>(l));
      }
      std::sort(load.begin(), load.end(), [&](int a, int b) {
        const uint64_t sa = model.layers[a].bytes, sb = model.layers[b].bytes;
        return sa != sb ? sa > sb : a > b;
      });
      for (int l : load) {
        copy_layer(step_index, s, l, true, sig);
        d.resident[l] = 1;
        d.resident_bytes += model.layers[l].bytes;
      }
      d.loaded_seq = ++seq_;
    }
    // Forward passes: every layer not on the device is copied for each pass.
    for (int pass = 0; pass < s.steps; ++pass)
      for (size_t l = 0; l < model.layers.size(); ++l)
        if (!d.resident[l]) copy_layer(step_index, s, static_cast<int>(l), false, sig);
  }

  void bound(RunPlan& plan, size_t first, const Prompt& p) {
    RunBound& b = plan.bound;
    for (int m : plan.models) b.used += t_.models[m].bytes;
    std::set<uint64_t> copied;
    std::set<int> loras;
    for (const Step& s : p.steps) loras.insert(s.loras.begin(), s.loras.end());
    for (size_t i = first; i < out_->accesses.size(); ++i) {
      const Access& a = out_->accesses[i];
      if (a.kind != Kind::Weights) continue;
      (a.resident ? b.resident_copy_bytes : b.streamed_bytes) += a.bytes;
      if (copied.insert(a.storage).second) {
        b.copied += a.bytes;
        plan.copied_keys.emplace_back(a.storage, a.bytes);
        if (ever_copied_.insert(a.storage).second) b.cold += a.bytes;
      }
    }
    b.kept = b.used - b.copied;
    b.app_ram = t_.machine.other_ram;
    for (int l : loras) b.app_ram += t_.loras[l].bytes;
    const uint64_t taken = b.app_ram + t_.machine.headroom;
    b.pin_capacity = t_.machine.ram > taken ? t_.machine.ram - taken : 0;
    b.ram_capacity = t_.machine.ram > b.app_ram ? t_.machine.ram - b.app_ram : 0;
    b.cache = b.pin_capacity + b.kept;
    const uint64_t warm = b.copied - b.cold;
    b.lower_bound = b.cold + (warm > b.pin_capacity ? warm - b.pin_capacity : 0);
    b.ram_lower_bound = b.cold + (warm > b.ram_capacity ? warm - b.ram_capacity : 0);
  }

  const Trace& t_;
  std::vector<DeviceModel> dev_;
  std::set<uint64_t> ever_copied_;
  uint64_t seq_ = 0;
  int run_ = 0;
  Expansion* out_ = nullptr;
};

}  // namespace

uint64_t window_bound(const Expansion& e, int first, int count, bool ram) {
  uint64_t sum = 0, cold = 0, distinct = 0, cap = UINT64_MAX;
  std::set<uint64_t> seen;
  for (int r = first; r < first + count && r < static_cast<int>(e.runs.size()); ++r) {
    const RunPlan& p = e.runs[r];
    sum += ram ? p.bound.ram_lower_bound : p.bound.lower_bound;
    cold += p.bound.cold;
    cap = std::min(cap, ram ? p.bound.ram_capacity : p.bound.pin_capacity);
    for (const auto& [key, bytes] : p.copied_keys)
      if (seen.insert(key).second) distinct += bytes;
  }
  const uint64_t warm = distinct - cold;
  const uint64_t union_bound = cold + (warm > cap ? warm - cap : 0);
  return std::max(sum, union_bound);
}

Expansion expand(const Trace& trace, const Sequence& sequence, int runs) {
  Expansion out;
  Expander e(trace);
  for (int r = 0; r < runs; ++r) e.run(r, trace.prompts[sequence.prompt_at(r)], out);
  for (size_t r = 0; r < out.runs.size(); ++r) out.runs[r].prompt = sequence.prompt_at(static_cast<int>(r));
  return out;
}

}  // namespace pins::sim
