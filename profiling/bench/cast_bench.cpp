// pins-bench cast: the cost of the pins::cast_to_device op on the CPU device,
// called as a C++ app calls it (include/pins/ops.h, through the dispatcher),
// against the plain torch call that moves the same bytes, in the same run
// (docs/PERFORMANCE.md, "cast").
//   hit     a 4 KiB float source served from its pin, against source.clone()
//   op      the same source with model=-1 (a plain copy inside the op), against clone()
//   check   the same hit with the content check off (PINS_CONF content_check:false),
//           against the hit with it on (Note [Content check]); and the same for a hit on
//           each of --cold sources of 4 KiB in turn, and of --cold/16 of 64 KiB, whose
//           windows are out of the caches (the median hit of a pass)
//   hit_bw  a 512 MiB fp16 source served from its pin, against at::empty + copy_
// On a CPU-only machine a hit and the baseline copy the same bytes from RAM to
// RAM: the difference is the op's own work. Ratios are baseline time / pins time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <pins/ops.h>

#include <algorithm>
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
  int reps = 5, calls = 20000, cold = 16384;
  for (Args a(args); a.next();) {
    if (a.is("--size")) {
      size = a.size();
    } else if (a.is("--calls")) {
      calls = a.positive();
    } else if (a.is("--reps")) {
      reps = a.positive();
    } else if (a.is("--cold")) {
      cold = a.positive();
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
  // Note [Content check]: pins made with the check on have windows; the "off"
  // figures turn it off around their calls only.
  pins::ops::configure("content_check:true");
  const auto check = [](bool on) { pins::ops::configure(on ? "content_check:true" : "content_check:false"); };

  // 4 KiB: per-call overhead.
  const at::Tensor small = at::randn({1024});  // float32
  const int64_t created0 = counter("pins");
  (void)pins::ops::cast_to_device(small, cpu, std::nullopt, false, model);  // the miss that creates the pin
  if (counter("pins") != created0 + 1) throw std::runtime_error("the 4 KiB source was not pinned (budget refused?)");
  std::vector<double> clone_s, hit_s, op_s, unchecked_s;
  const int64_t hits0 = counter("hits");
  const auto hit_small = [&] { keep(pins::ops::cast_to_device(small, cpu, std::nullopt, false, model).data_ptr()); };
  for (int rep = 0; rep < reps; ++rep) {
    clone_s.push_back(per_call(calls, [&] { keep(small.clone().data_ptr()); }));
    hit_s.push_back(per_call(calls, hit_small));
    check(false);
    unchecked_s.push_back(per_call(calls, hit_small));
    check(true);
    op_s.push_back(per_call(calls, [&] { keep(pins::ops::cast_to_device(small, cpu).data_ptr()); }));
  }
  const int64_t hits = counter("hits") - hits0;
  if (hits != int64_t{2} * reps * calls)
    throw std::runtime_error("expected " + std::to_string(int64_t{2} * reps * calls) +
                             " hits on the 4 KiB pin, got " + std::to_string(hits));

  // The check with its windows out of the caches: a hit on each of `count`
  // sources of `elements` floats in turn. A pass copies `cold` x 4 KiB of pins
  // (64 MiB at the default), more than the last-level cache of most machines
  // and the TLB's reach, so each hit reads its source's windows, and the pages
  // they lie in, from RAM: one page for a 4 KiB source, four for a 64 KiB one,
  // as for any large weight. Every pin has its windows; a pass runs with the
  // check on or off, the two alternating in order by repetition, and counts
  // its median hit (a preemption is one outlier, not a share of the mean).
  // `many` keeps the sources to the end: their pins dying would be reclaimed
  // during later casts and move the pin counts those check.
  std::vector<at::Tensor> many;
  const auto cold_passes = [&](int count, int64_t elements, std::vector<double>& on_s, std::vector<double>& off_s) {
    std::vector<at::Tensor> sources;
    for (int i = 0; i < count; ++i) sources.push_back(at::randn({elements}));
    const int64_t pins0 = counter("pins");
    for (const at::Tensor& t : sources) (void)pins::ops::cast_to_device(t, cpu, std::nullopt, false, model);
    if (counter("pins") != pins0 + count) throw std::runtime_error("the --cold sources were not all pinned");
    std::vector<double> took;
    const int64_t hits0 = counter("hits");
    for (int rep = 0; rep < reps; ++rep) {
      for (int k = 0; k < 2; ++k) {
        const bool on = (rep + k) % 2 == 0;
        check(on);
        took.clear();
        for (const at::Tensor& t : sources) {
          const double t0 = now_seconds();
          keep(pins::ops::cast_to_device(t, cpu, std::nullopt, false, model).data_ptr());
          took.push_back(now_seconds() - t0);
        }
        (on ? on_s : off_s).push_back(median(took));
      }
      check(true);
    }
    if (counter("hits") - hits0 != int64_t{2} * reps * count)
      throw std::runtime_error("the --cold sources were not all served from their pins");
    many.insert(many.end(), sources.begin(), sources.end());
  };
  std::vector<double> cold_on_s, cold_off_s, wide_on_s, wide_off_s;
  cold_passes(cold, 1024, cold_on_s, cold_off_s);                        // 4 KiB
  cold_passes(std::max(1, cold / 16), 16384, wide_on_s, wide_off_s);    // 64 KiB, the same bytes
  if (counter("content_mismatches") != 0) throw std::runtime_error("a content mismatch on sources nobody wrote");

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

  const double clone = median(clone_s), hit = median(hit_s), op = median(op_s), unchecked = median(unchecked_s);
  const double cold_on = median(cold_on_s), cold_off = median(cold_off_s);
  const double wide_on = median(wide_on_s), wide_off = median(wide_off_s);
  const double raw = median(raw_s), big_hit = median(big_s);
  std::printf("per repetition (4 KiB: mean of %d calls):\n", calls);
  print_reps("baseline small.clone()", clone_s, 1e6, "us");
  print_reps("cast hit (4 KiB pin)", hit_s, 1e6, "us");
  print_reps("cast model=-1", op_s, 1e6, "us");
  print_reps("cast hit, content_check off", unchecked_s, 1e6, "us");
  std::printf("  hit overhead %.2f us (ratio %.3f), op overhead %.2f us (ratio %.3f)\n", (hit - clone) * 1e6,
              clone / hit, (op - clone) * 1e6, clone / op);
  std::printf("  content check: %+.3f us per hit (on %.3f us, off %.3f us)\n", (hit - unchecked) * 1e6, hit * 1e6,
              unchecked * 1e6);
  std::printf("per repetition (a hit on each source in turn, windows out of the caches and the TLB; the median hit "
              "of a pass):\n");
  print_reps("cast hit, cold 4 KiB, check on", cold_on_s, 1e6, "us");
  print_reps("cast hit, cold 4 KiB, check off", cold_off_s, 1e6, "us");
  print_reps("cast hit, cold 64 KiB, check on", wide_on_s, 1e6, "us");
  print_reps("cast hit, cold 64 KiB, check off", wide_off_s, 1e6, "us");
  std::printf("  content check, cold: %+.3f us per hit of %d sources of 4 KiB (windows in one page), %+.3f us of %d "
              "of 64 KiB (in four)\n",
              (cold_on - cold_off) * 1e6, cold, (wide_on - wide_off) * 1e6, std::max(1, cold / 16));
  print_reps("baseline at::empty + copy_, big", raw_s, 1e3, "ms");
  print_reps("cast hit, big", big_s, 1e3, "ms");
  std::printf("  %.1f MiB: baseline %.2f GB/s, hit %.2f GB/s\n", double(size) / double(MiB), double(size) / raw * 1e-9,
              double(size) / big_hit * 1e-9);
  std::printf(
      "RESULT hit_overhead_us=%.2f hit_ratio=%.3f op_overhead_us=%.2f op_ratio=%.3f hit_bw_ratio=%.3f "
      "check_us=%.3f check_cold_us=%.3f check_cold_64k_us=%.3f\n",
      (hit - clone) * 1e6, clone / hit, (op - clone) * 1e6, clone / op, raw / big_hit, (hit - unchecked) * 1e6,
      (cold_on - cold_off) * 1e6, (wide_on - wide_off) * 1e6);
  return 0;
}

}  // namespace pins::bench
