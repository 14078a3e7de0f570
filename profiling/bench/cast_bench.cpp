// pins-bench cast: the cost of the pins::cast_to_device op on the CPU device,
// called as a C++ app calls it (include/pins/ops.h, through the dispatcher),
// against the plain torch call that moves the same bytes, in the same run
// (docs/PERFORMANCE.md, "cast").
//   hit     a 4 KiB float source served from its pin, against source.clone()
//   op      the same source with model=-1 (a plain copy inside the op), against clone()
//   hit_bw  a 512 MiB fp16 source served from its pin, against at::empty + copy_
// On a CPU-only machine a hit and the baseline copy the same bytes from RAM to
// RAM: the difference is the op's own work. Ratios are baseline time / pins time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <pins/ops.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/base/size.h"
#include "profiling/bench/args.h"
#include "profiling/bench/timing.h"

namespace pins::bench {
namespace {

int64_t counter(const char* name) {
  const c10::Dict<std::string, int64_t> s = pins::ops::stats();
  auto it = s.find(name);
  if (it == s.end()) throw std::runtime_error(std::string("pins::stats has no counter '") + name + "'");
  return it->value();
}

// Mean seconds per call of `f` over `calls` calls.
template <typename F>
double per_call(int calls, F&& f) {
  return time_seconds([&] {
           for (int i = 0; i < calls; ++i) f();
         }) /
         calls;
}

}  // namespace

int cast_main(const std::vector<std::string>& args) {
  uint64_t size = 512 * MiB;
  int reps = 5, calls = 20000;
  for (Args a(args); a.next();) {
    if (a.is("--size")) {
      size = a.size();
    } else if (a.is("--calls")) {
      calls = a.positive();
    } else if (a.is("--reps")) {
      reps = a.positive();
    } else {
      a.unknown();
    }
  }
  if (size < 2) throw std::invalid_argument("--size: expected at least 2 bytes (one fp16 element)");
  const char* conf = std::getenv("PINS_CONF");
  std::printf("pins-bench cast: CPU device, %d repetitions, medians; %d intra-op threads; PINS_CONF=%s\n", reps,
              at::get_num_threads(), conf ? conf : "(unset: defaults)");
  std::printf("on a CPU-only machine a hit and the baseline copy the same bytes RAM to RAM: the difference is the "
              "op's own work\n\n");

  const c10::Device cpu(c10::kCPU);
  const int64_t model = pins::ops::register_model("bench-cast", cpu);

  // 4 KiB: per-call overhead.
  const at::Tensor small = at::randn({1024});  // float32
  const int64_t created0 = counter("pins");
  (void)pins::ops::cast_to_device(small, cpu, std::nullopt, false, model);  // the miss that creates the pin
  if (counter("pins") != created0 + 1) throw std::runtime_error("the 4 KiB source was not pinned (budget refused?)");
  std::vector<double> clone_s, hit_s, op_s;
  const int64_t hits0 = counter("hits");
  for (int rep = 0; rep < reps; ++rep) {
    clone_s.push_back(per_call(calls, [&] { keep(small.clone().data_ptr()); }));
    hit_s.push_back(per_call(calls, [&] { keep(pins::ops::cast_to_device(small, cpu, std::nullopt, false, model).data_ptr()); }));
    op_s.push_back(per_call(calls, [&] { keep(pins::ops::cast_to_device(small, cpu).data_ptr()); }));
  }
  const int64_t hits = counter("hits") - hits0;
  if (hits != int64_t{reps} * calls)
    throw std::runtime_error("expected " + std::to_string(int64_t{reps} * calls) + " hits on the 4 KiB pin, got " +
                             std::to_string(hits));

  // 512 MiB: bandwidth of a hit. Fresh destinations on both sides, as each call allocates its result.
  const at::Tensor big = at::empty({static_cast<int64_t>(size / 2)}, at::kHalf).fill_(1.5);
  const int64_t pins0 = counter("pins");
  (void)pins::ops::cast_to_device(big, cpu, std::nullopt, false, model);
  if (counter("pins") != pins0 + 1)
    throw std::runtime_error("the " + std::to_string(size >> 20) +
                             " MiB source was not pinned: too little available RAM for the default budget (headroom); "
                             "try a smaller --size");
  std::vector<double> raw_s, big_s;
  const int64_t big_hits0 = counter("hits");
  for (int rep = 0; rep < reps; ++rep) {
    raw_s.push_back(time_seconds([&] {
      at::Tensor out = at::empty(big.sizes(), big.options());
      out.copy_(big);
      keep(out.data_ptr());
    }));
    big_s.push_back(time_seconds([&] { keep(pins::ops::cast_to_device(big, cpu, std::nullopt, false, model).data_ptr()); }));
  }
  if (counter("hits") - big_hits0 != reps) throw std::runtime_error("the big source was not served from its pin");
  pins::ops::forget_model(model);

  const double clone = median(clone_s), hit = median(hit_s), op = median(op_s);
  const double raw = median(raw_s), big_hit = median(big_s);
  std::printf("per repetition (4 KiB: mean of %d calls):\n", calls);
  print_reps("baseline small.clone()", clone_s, 1e6, "us");
  print_reps("cast hit (4 KiB pin)", hit_s, 1e6, "us");
  print_reps("cast model=-1", op_s, 1e6, "us");
  std::printf("  hit overhead %.2f us (ratio %.3f), op overhead %.2f us (ratio %.3f)\n", (hit - clone) * 1e6,
              clone / hit, (op - clone) * 1e6, clone / op);
  print_reps("baseline at::empty + copy_, big", raw_s, 1e3, "ms");
  print_reps("cast hit, big", big_s, 1e3, "ms");
  std::printf("  %.1f MiB: baseline %.2f GB/s, hit %.2f GB/s\n", double(size) / double(MiB), double(size) / raw * 1e-9,
              double(size) / big_hit * 1e-9);
  std::printf("RESULT hit_overhead_us=%.2f hit_ratio=%.3f op_overhead_us=%.2f op_ratio=%.3f hit_bw_ratio=%.3f\n",
              (hit - clone) * 1e6, clone / hit, (op - clone) * 1e6, clone / op, raw / big_hit);
  return 0;
}

}  // namespace pins::bench
