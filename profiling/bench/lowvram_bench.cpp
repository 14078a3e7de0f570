// pins-bench lowvram: a model streamed layer by layer, as in ComfyUI's lowvram
// mode (docs/PERFORMANCE.md, "lowvram"). L layers of M MiB of fp16 weights,
// P passes; each pass casts every layer in order to bf16 on the CPU device,
// once through pins (a registered model, resident=false, one prompt per pass)
// and once as plain `w.to(torch::kBFloat16)`, the two interleaved pass by pass.
// The pin budget holds about half the model: pins::configure sets headroom
// and pin_reserve to MemAvailable (as the balancer reads it) minus half the
// model's bytes, so pins stop growing when about that much is pinned. Each
// policy gets a fresh model; forget_model frees its pins afterwards.
// Ratios are pins pass time / plain pass time: first pass, and the median of
// passes 2..P over the median of the plain ones.
//
// Each policy runs once per prewarm variant (Note [Prewarm] in
// csrc/balancer/prewarm.h; --prewarm), the model registered with its size:
//   ahead    the default configuration: before each pins pass (untimed, after
//            the plain pass) the model is marked in the prompt, which wakes the
//            prewarm, and the bench waits for it; the time is printed (what a
//            model load gives it in ComfyUI, where load_models_gpu marks the
//            model before loading it). Keys first_pass_ratio_<policy>, ...
//   off      prewarm:false, the figures as before the prewarm. Keys ..._noprewarm.
//   racing   prewarm on, the pass timed from the wake-up (no lead time: the
//            prewarm runs beside the casts). Keys ..._racing.
// Between variants the pins are forgotten and the pool's idle memory given
// back (free_pins), so each first pass starts with no warm memory. --device cuda:0 casts to a
// GPU instead (profiling/gpu_check.sh): the plain side is then
// `w.to(device, torch::kBFloat16)`, and each pass ends when the device is done.
//
// The sources are in RAM, so nothing is read from disk: on a CPU-only machine a
// hit copies the same bytes as the plain cast (and more: the pin's copy, then
// the conversion), so pins can only add work here.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <pins/ops.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "csrc/base/size.h"
#include "csrc/system/sysmem.h"
#include "profiling/bench/args.h"
#include "profiling/bench/timing.h"

namespace pins::bench {
namespace {

int64_t counter(const c10::Dict<std::string, int64_t>& s, const std::string& name) {
  auto it = s.find(name);
  if (it == s.end()) throw std::runtime_error("pins::stats has no counter '" + name + "'");
  return it->value();
}

// "3.20 GiB", or "2.0 MiB" below a GiB.
std::string human(uint64_t bytes) {
  char buf[32];
  if (bytes >= GiB)
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(GiB));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(MiB));
  return buf;
}

}  // namespace

int lowvram_main(const std::vector<std::string>& args) {
  int layers = 200, layer_mib = 32, passes = 5;
  std::vector<std::string> policies = {"mru", "lru", "trace"};
  std::vector<std::string> prewarms = {"off", "ahead", "racing"};
  std::string device_name = "cpu";
  for (Args a(args); a.next();) {
    if (a.is("--layers")) {
      layers = a.positive();
    } else if (a.is("--layer-mib")) {
      layer_mib = a.positive();
    } else if (a.is("--passes")) {
      passes = a.positive();
      if (passes < 2) throw std::invalid_argument("--passes: expected at least 2 (a first and a steady pass), got 1");
    } else if (a.is("--policies")) {
      policies = a.choice_list({"mru", "lru", "trace"});
    } else if (a.is("--prewarm")) {
      prewarms = a.choice_list({"off", "ahead", "racing"});
    } else if (a.is("--device")) {
      device_name = a.value();
    } else {
      a.unknown();
    }
  }
  const uint64_t layer_bytes = uint64_t(layer_mib) * MiB;
  const uint64_t model_bytes = layer_bytes * uint64_t(layers);
  const c10::Device device(device_name);  // c10::Error names a bad one
  const bool on_cpu = device.is_cpu();
  std::printf("pins-bench lowvram: %d layers x %d MiB fp16 (%s), %d passes, cast to bf16 on %s; "
              "%d intra-op threads\n",
              layers, layer_mib, human(model_bytes).c_str(), passes, device.str().c_str(), at::get_num_threads());
  if (on_cpu)
    std::printf("the sources are in RAM (nothing is read from disk): a hit moves the same bytes as the plain cast, "
                "so on a CPU-only machine pins cannot win here\n\n");
  else
    std::printf("plain: w.to(%s, bf16) from pageable memory; pins: a hit copies from a pinned block\n\n",
                device.str().c_str());
  // The end of a pass on a device: a blocking copy back waits for its stream.
  const auto finish = [&](const at::Tensor& last) {
    if (!on_cpu && last.defined()) keep(last.view(-1).slice(0, 0, 1).to(at::kCPU).data_ptr());
  };

  // The sources: one random layer, cloned (randn over gigabytes would take minutes).
  const at::Tensor first = at::randn({static_cast<int64_t>(layer_bytes / 2)}).to(at::kHalf);
  std::vector<at::Tensor> weights;
  weights.reserve(layers);
  for (int i = 0; i < layers; ++i) weights.push_back(i == 0 ? first : first.clone());

  // Note [Prewarm]: until the prewarm's round (if any) is over, polling its counter.
  const auto wait_prewarm = [] {
    while (counter(pins::ops::stats(), "prewarm_busy") != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };

  std::string result;
  char buf[200];
  for (const std::string& policy : policies) {
   for (const std::string& prewarm : prewarms) {
    const bool on = prewarm != "off";
    const std::string suffix = prewarm == "ahead" ? "" : prewarm == "off" ? "_noprewarm" : "_racing";
    // The budget: pins may take MemAvailable down to `floor`, which leaves about half the model pinned.
    const uint64_t available = SystemMemoryProbe().read().available;
    const uint64_t target = model_bytes / 2;
    if (available < target + 2 * GiB)
      throw std::runtime_error("MemAvailable is " + std::to_string(available >> 20) + " MiB with the sources in RAM; " +
                               "pinning half the model needs about " + std::to_string((target + 2 * GiB) >> 20) +
                               " MiB: try fewer --layers");
    const uint64_t floor = available - target;
    const std::string conf = "policy:" + policy + ",headroom:" + std::to_string(floor) +
                             ",pin_reserve:" + std::to_string(floor) + ",prewarm:" + (on ? "true" : "false");
    pins::ops::configure(conf);
    std::printf("%s, prewarm %s: MemAvailable %s; configure(\"%s\")\n  (headroom = pin_reserve = %s: pins stop at "
                "about %s, half the model)\n",
                policy.c_str(), prewarm.c_str(), human(available).c_str(), conf.c_str(), human(floor).c_str(),
                human(target).c_str());
    // Its size registered: what its first prompt is expected to pin (Note [Prewarm]).
    const int64_t model = pins::ops::register_model("lowvram-" + policy + suffix, device, false,
                                                    static_cast<int64_t>(model_bytes));
    std::vector<double> prewarm_s;

    std::vector<double> plain_s, pins_s;
    for (int pass = 0; pass < passes; ++pass) {
      const c10::Dict<std::string, int64_t> pass_start = pins::ops::stats();
      plain_s.push_back(time_seconds([&] {
        at::Tensor last;
        for (const at::Tensor& w : weights) {
          last = on_cpu ? w.to(at::kBFloat16) : w.to(device, at::kBFloat16);
          keep(last.data_ptr());
        }
        finish(last);
      }));
      if (prewarm == "ahead") {  // untimed: the lead a model load gives the prewarm
        prewarm_s.push_back(time_seconds([&] {
          pins::ops::mark_prompt({model});
          wait_prewarm();
        }));
      }
      const c10::Dict<std::string, int64_t> before = pins::ops::stats();
      pins_s.push_back(time_seconds([&] {
        pins::ops::mark_prompt({model});
        at::Tensor last;
        for (const at::Tensor& w : weights) {
          last = pins::ops::cast_to_device(w, device, at::kBFloat16, false, model, "weights", false);
          keep(last.data_ptr());
        }
        finish(last);
        pins::ops::end_prompt();
      }));
      wait_prewarm();  // untimed: a racing round ends before the next plain pass
      const c10::Dict<std::string, int64_t> after = pins::ops::stats();
      const auto delta = [&](const char* k) { return counter(after, k) - counter(before, k); };
      std::printf("  pass %d: plain %.3f s, pins %.3f s (x%.2f); hits %lld, misses %lld, evictions %lld, refusals "
                  "%lld; pinned %s; prewarmed %s, of which pins took %s\n",
                  pass + 1, plain_s.back(), pins_s.back(), pins_s.back() / plain_s.back(),
                  static_cast<long long>(delta("hits")), static_cast<long long>(delta("misses")),
                  static_cast<long long>(delta("evictions")), static_cast<long long>(delta("refusals")),
                  human(static_cast<uint64_t>(counter(after, "pinned_bytes"))).c_str(),
                  human(static_cast<uint64_t>(counter(after, "prewarm_bytes") - counter(pass_start, "prewarm_bytes")))
                      .c_str(),
                  human(static_cast<uint64_t>(delta("prewarm_served_bytes"))).c_str());
    }
    pins::ops::forget_model(model);
    pins::ops::free_pins(int64_t{1} << 40, true);  // and the idle memory: the next variant starts cold

    const double first_ratio = pins_s[0] / plain_s[0];
    const std::vector<double> plain_steady(plain_s.begin() + 1, plain_s.end());
    const std::vector<double> pins_steady(pins_s.begin() + 1, pins_s.end());
    const double steady_ratio = median(pins_steady) / median(plain_steady);
    print_reps("plain w.to(bf16) pass", plain_s, 1, "s");
    print_reps("pins pass", pins_s, 1, "s");
    if (!prewarm_s.empty()) print_reps("prewarm before the pass (untimed)", prewarm_s, 1, "s");
    std::printf("  first pass x%.3f, steady passes (median of 2..%d) x%.3f\n\n", first_ratio, passes, steady_ratio);
    std::snprintf(buf, sizeof buf, " first_pass_ratio_%s%s=%.3f steady_pass_ratio_%s%s=%.3f", policy.c_str(),
                  suffix.c_str(), first_ratio, policy.c_str(), suffix.c_str(), steady_ratio);
    result += buf;
   }
  }
  std::printf("RESULT%s\n", result.c_str());
  return 0;
}

}  // namespace pins::bench
