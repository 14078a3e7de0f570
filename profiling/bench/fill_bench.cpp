// pins-bench fill: how fast a pin is filled, against a memcpy into a warm
// malloc'd buffer of the same size measured in the same run (docs/PERFORMANCE.md, "fill").
//   warm   memcpy into a pool block that is committed and touched already.
//   fresh  a new pin through the real path: Balancer::acquire() on a HostPool
//          with the cpu backend and the default configuration, memcpy into it,
//          filled(), the lease released; then the pin is evicted as the
//          balancer does under pressure (Balancer::free), so the next new pin
//          gets fresh pages.
//          The evicted pin's memory stays committed within the budget (Note
//          [Warm idle memory] in csrc/balancer/budget_gate.h), so this new pin
//          reuses warm pages.
//   cold   the same new pin into pages never touched: its model forgotten and
//          the pool trimmed to nothing after each, so every pin commits (and
//          populates) fresh pages on the hot path: the worst case. Three ways:
//          - prewarm off: as it was before the prewarm (Note [Prewarm] in
//            csrc/balancer/prewarm.h);
//          - prewarmed (the default configuration): the model is registered
//            with its size, and before each pin it is marked in the prompt and
//            the prewarm woken, as load_models_gpu does in ComfyUI; the bench
//            waits for the prewarm (untimed, printed: the time a model load
//            gives it) and then times the pin, which finds its pages backed;
//          - racing: the same, but the pin is timed at once after the wake-up,
//            with the prewarm running beside it (no lead time).
//   warm, N threads   memcpy into the warm pool block in N chunks on N threads
//          (N = --threads, default 2): what a chunked fill gains here.
// Ratios are baseline time / pins time: 1.0 is as fast as the warm memcpy.
// docs/PERFORMANCE.md also keeps the figures of a fresh fill with
// retain_free:4G, evicted and forgotten, measured on commit d7b4948.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "csrc/balancer/balancer.h"
#include "csrc/balancer/prewarm.h"
#include "csrc/pool/pool.h"
#include "csrc/config/config.h"
#include "csrc/system/sysmem.h"
#include "profiling/bench/args.h"
#include "profiling/bench/timing.h"

namespace pins::bench {
namespace {

// One way of making a new pin per repetition, with its own pool and balancer.
class FreshFill {
 public:
  enum class Drop { Evict, Forget, ForgetTrim };
  // Note [Prewarm]: none, woken and waited for before the pin, woken just before it.
  enum class Prewarm { Off, Ahead, Racing };

  FreshFill(std::string label, const std::string& conf, Drop drop, Prewarm prewarm = Prewarm::Off,
            size_t size = 0)
      : label_(std::move(label)),
        config_(parse_config(conf)),
        pool_(make_cpu_backend(config_.mlock), pool_options(config_)),
        bal_(config_, pool_, probe_),
        drop_(drop),
        prewarm_(prewarm) {
    options_.size = prewarm == Prewarm::Off ? 0 : size;
    model_ = bal_.register_model("fill", "cpu", options_);
    if (prewarm_ != Prewarm::Off) prewarmer_ = std::make_unique<Prewarmer>(bal_);
  }

  // Untimed: the model marked in the prompt and the prewarm woken; waited for when Ahead.
  void before_fill() {
    if (prewarm_ == Prewarm::Off) return;
    const PoolStats before = pool_.stats();
    const double t = time_seconds([&] {
      bal_.mark_prompt({model_});
      prewarmer_->wake();
      if (prewarm_ == Prewarm::Ahead) wait_prewarm();
    });
    if (prewarm_ == Prewarm::Ahead) {
      prewarm_s_.push_back(t);
      prewarm_bytes_ += pool_.stats().prewarmed_bytes.allocated - before.prewarmed_bytes.allocated;
    }
  }
  // Untimed: a racing prewarm finishes, the prompt ends.
  void after_fill() {
    if (prewarm_ == Prewarm::Off) return;
    wait_prewarm();
    bal_.end_prompt();
  }

  // acquire + memcpy + filled + release of a new pin of `size`: the timed part.
  double fill(const void* src, size_t size) {
    Request r;
    r.model = model_;
    r.key = PinKey{++next_key_, 0, size};
    r.bytes = size;
    const PoolStats before = pool_.stats();
    const double t = time_seconds([&] {
      Lease lease = bal_.acquire(r);
      if (!lease)
        throw std::runtime_error("the balancer refused a pin of " + std::to_string(size >> 20) +
                                 " MiB (too little available RAM for its budget; try a smaller --size)");
      if (!lease.needs_fill()) throw std::runtime_error("a new key was served as a hit");
      std::memcpy(lease.data(), src, size);
      keep(lease.data());
      lease.filled();
    });
    const PoolStats after = pool_.stats();
    fill_s_.push_back(t);
    commit_s_.push_back(double(after.commit_ns - before.commit_ns) * 1e-9);
    commits_ += after.commits - before.commits;
    served_ += after.prewarm_served_bytes - before.prewarm_served_bytes;
    return t;
  }

  // Untimed in the ratio: the eviction (free()) or drop (forget_model()) after the fill.
  void drop(size_t size) {
    const PoolStats before = pool_.stats();
    drop_s_.push_back(time_seconds([&] {
      if (drop_ == Drop::Evict) {
        if (bal_.free(size) < size) throw std::runtime_error("Balancer::free did not evict the pin");
      } else {
        bal_.forget_model(model_);
        model_ = bal_.register_model("fill", "cpu", options_);
        if (drop_ == Drop::ForgetTrim) pool_.trim(0);
      }
    }));
    decommits_ += pool_.stats().decommits - before.decommits;
  }

  void print(double baseline_median) const {
    std::printf("%s\n", label_.c_str());
    print_reps("fill (acquire+memcpy+release)", fill_s_, 1e3, "ms");
    print_reps("  of which committing pages", commit_s_, 1e3, "ms");
    print_reps(drop_ == Drop::Evict    ? "evict: Balancer::free (untimed)"
               : drop_ == Drop::Forget ? "drop: forget_model (untimed)"
                                       : "drop: forget_model + HostPool::trim(0) (untimed)",
               drop_s_, 1e3, "ms");
    if (!prewarm_s_.empty()) print_reps("prewarm before the pin (untimed)", prewarm_s_, 1e3, "ms");
    std::printf("  extents committed %lld, decommitted %lld over %zu pins; ratio %.3f\n",
                static_cast<long long>(commits_), static_cast<long long>(decommits_), fill_s_.size(),
                baseline_median / median(fill_s_));
    if (prewarm_ != Prewarm::Off)
      std::printf("  prewarm: %.1f MiB committed ahead per pin, %.1f MiB of the pins' memory came from it (rounds %llu, errors %llu)\n",
                  double(prewarm_bytes_) / double(fill_s_.size()) / double(MiB),
                  double(served_) / double(fill_s_.size()) / double(MiB),
                  static_cast<unsigned long long>(prewarmer_->rounds()),
                  static_cast<unsigned long long>(prewarmer_->errors()));
  }
  double median_fill() const { return median(fill_s_); }

 private:
  std::string label_;
  Config config_;
  HostPool pool_;
  SystemMemoryProbe probe_;
  Balancer bal_;
  Drop drop_;
  Prewarm prewarm_;
  ModelOptions options_;
  std::unique_ptr<Prewarmer> prewarmer_;  // declared after bal_: stopped before it goes
  ModelId model_ = -1;
  uint64_t next_key_ = 0;
  std::vector<double> fill_s_, commit_s_, drop_s_, prewarm_s_;
  int64_t commits_ = 0, decommits_ = 0, served_ = 0, prewarm_bytes_ = 0;

  void wait_prewarm() {
    while (prewarmer_->busy()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
};

// memcpy in `threads` contiguous chunks, one per thread (this one does the first).
void chunked_copy(char* dst, const char* src, size_t size, int threads) {
  const size_t step = (size / threads + 4095) / 4096 * 4096;
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) {
    const size_t off = step * i;
    if (off >= size) break;
    pool.emplace_back([=] { std::memcpy(dst + off, src + off, std::min(step, size - off)); });
  }
  std::memcpy(dst, src, std::min(step, size));
  for (std::thread& t : pool) t.join();
}

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line.empty() ? "unknown" : line;
}

}  // namespace

int fill_main(const std::vector<std::string>& args) {
  uint64_t size = 512 * MiB;
  int reps = 5;
  int threads = 2;
  for (Args a(args); a.next();) {
    if (a.is("--size")) {
      size = a.size();
    } else if (a.is("--threads")) {
      threads = a.positive();
    } else if (a.is("--reps")) {
      reps = a.positive();
    } else {
      a.unknown();
    }
  }

  std::printf("pins-bench fill: %llu bytes (%.1f MiB), %d repetitions, medians; cpu backend, mlock off\n",
              static_cast<unsigned long long>(size), double(size) / double(MiB), reps);
  std::printf("transparent huge pages: %s\n",
              first_line("/sys/kernel/mm/transparent_hugepage/enabled").c_str());
  std::printf("baseline: memcpy into a warm malloc'd buffer that was touched before\n\n");

  // The source and the baseline's destination: malloc'd, every page touched.
  std::unique_ptr<char, decltype(&std::free)> src(static_cast<char*>(std::malloc(size)), &std::free);
  std::unique_ptr<char, decltype(&std::free)> dst(static_cast<char*>(std::malloc(size)), &std::free);
  if (!src || !dst) throw std::runtime_error("malloc of the source or the baseline buffer failed");
  // Not zeros: the compiler may turn malloc + memset(0) into calloc, which leaves fresh pages untouched.
  for (size_t i = 0; i < size; ++i) src.get()[i] = static_cast<char>(i * 131 + 7);
  std::memset(dst.get(), 0x11, size);
  std::memcpy(dst.get(), src.get(), size);
  keep(dst.get());

  // The warm pool block: committed (populated) by the pool, then touched once.
  const Config defaults;
  HostPool warm_pool(make_cpu_backend(defaults.mlock), pool_options(defaults));
  void* block = warm_pool.allocate(size);
  std::memset(block, 0x11, size);
  std::memcpy(block, src.get(), size);
  keep(block);

  std::vector<std::unique_ptr<FreshFill>> fresh;
  fresh.push_back(std::make_unique<FreshFill>("fresh: default config, evicted by Balancer::free", "",
                                              FreshFill::Drop::Evict));
  fresh.push_back(std::make_unique<FreshFill>(
      "cold: prewarm off, forgotten and trimmed (fresh pages every pin, committed on the hot path)", "prewarm:false",
      FreshFill::Drop::ForgetTrim));
  fresh.push_back(std::make_unique<FreshFill>(
      "cold+prewarm: default config, forgotten and trimmed; the prewarm commits the pin's size ahead, waited for",
      "", FreshFill::Drop::ForgetTrim, FreshFill::Prewarm::Ahead, size));
  fresh.push_back(std::make_unique<FreshFill>(
      "cold+racing: the same, the pin timed at once after the prewarm's wake-up (no lead time)", "",
      FreshFill::Drop::ForgetTrim, FreshFill::Prewarm::Racing, size));

  // Repetitions interleave every variant, so a neighbour's load hits them alike.
  std::vector<double> base_s, warm_s, warm_mt_s;
  for (int rep = 0; rep < reps; ++rep) {
    base_s.push_back(time_seconds([&] {
      std::memcpy(dst.get(), src.get(), size);
      keep(dst.get());
    }));
    warm_s.push_back(time_seconds([&] {
      std::memcpy(block, src.get(), size);
      keep(block);
    }));
    warm_mt_s.push_back(time_seconds([&] {
      chunked_copy(static_cast<char*>(block), src.get(), size, threads);
      keep(block);
    }));
    for (auto& f : fresh) {
      f->before_fill();
      f->fill(src.get(), size);
      f->after_fill();
      f->drop(size);
    }
  }
  warm_pool.free(block);

  const double base = median(base_s);
  std::printf("per repetition:\n");
  print_reps("baseline memcpy, warm malloc", base_s, 1e3, "ms");
  std::printf("  baseline: %.2f GB/s\n", double(size) / base * 1e-9);
  print_reps("memcpy into a warm pool block", warm_s, 1e3, "ms");
  std::printf("  ratio %.3f\n", base / median(warm_s));
  char label[64];
  std::snprintf(label, sizeof label, "same, %d chunks on %d threads", threads, threads);
  print_reps(label, warm_mt_s, 1e3, "ms");
  std::printf("  ratio %.3f\n", base / median(warm_mt_s));
  for (const auto& f : fresh) f->print(base);
  std::printf("(extents decommitted by the eviction or drop mean the next pin commits fresh pages)\n");
  // fill_cold_ratio is the default configuration's (prewarm on, given the lead time a model load gives it);
  // fill_cold_noprewarm_ratio the same pin with the prewarm off, fill_cold_racing_ratio with no lead time.
  std::printf(
      "RESULT fill_warm_ratio=%.3f fill_fresh_ratio=%.3f fill_cold_ratio=%.3f fill_cold_noprewarm_ratio=%.3f "
      "fill_cold_racing_ratio=%.3f fill_warm_mt_ratio=%.3f\n",
      base / median(warm_s), base / fresh[0]->median_fill(), base / fresh[2]->median_fill(),
      base / fresh[1]->median_fill(), base / fresh[3]->median_fill(), base / median(warm_mt_s));
  return 0;
}

}  // namespace pins::bench
