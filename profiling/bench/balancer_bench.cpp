// pins-bench balancer: what one eviction decision and one prompt boundary cost
// as the number of pins grows (docs/PERFORMANCE.md, "eviction decisions").
// Bookkeeping only: a Balancer over a HostPool with the null backend and a fake
// MemoryProbe that reports plenty of RAM, so every pin is created and nothing is
// evicted unless asked.
//
// For each policy and pin count N: four models, two of them in the prompt;
// prompt 1 creates N weight pins of 4-256 KiB (round-robin over the models)
// and ends; prompt 2 hits the first half of them again, so the trace policy
// follows prompt 1's record with its cursor in the middle. Then
//   decision    Balancer::free(the smallest pin size): one pin evicted; after
//               each, a new pin is created (untimed) so N stays. The new pins
//               are patch pins: a weight the record does not know would make
//               the trace policy depart from it and fall back to mru.
//   end_prompt  what the pins::end_prompt op runs (Balancer::end_prompt, a
//               bounded reclaim step, relieve), after a prompt that hit every pin once; the pins the
//               boundary drops are replaced (untimed) so N stays.
//   first decision  the next prompt's first decision, after it repeated the
//               first access of the prompt before: under the trace policy it
//               ranks every pin against the new record once (Note [Trace
//               index]); under the others it is a decision like any other.
//   hit         (the smallest N only) a prompt that hits every weight pin
//               again, per access: first while the trace follows the records
//               of the two prompts above, then once the kept records are
//               kRecords such prompts, all followed (Note [Trace memory]: each
//               access looks its key up in every followed record).
//   sweep       Balancer::sweep() alone (no source died): the check of every
//               pin's source that only the free_pins op runs now; decisions and
//               boundaries check a bounded number of ring slots instead
//               (Note [Dead source reclaim] in csrc/balancer/reclaim_ring.h); the
//               rest of a decision is the eviction walk (Note [Eviction walk]).
// Growth ratios are the figure at the largest N over the one at the smallest;
// decision_growth_over_floor divides a policy's by the growth of the index
// work any eviction does (index_floor_seconds), measured in the same run.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "csrc/balancer/balancer.h"
#include "csrc/balancer/trace.h"
#include "csrc/pool/pool.h"
#include "csrc/config/config.h"
#include "csrc/system/sysmem.h"
#include "profiling/bench/args.h"
#include "profiling/bench/timing.h"

namespace pins::bench {
namespace {

// RAM as the balancer sees it: a fixed amount free before pins, minus what the
// pool has committed (the fake of tests/csrc/balancer/balancer_test.cpp).
class FakeProbe : public MemoryProbe {
 public:
  FakeProbe(HostPool& pool, uint64_t total, uint64_t free_before_pins)
      : pool_(pool), total_(total), free_(free_before_pins) {}
  MemoryInfo read() override {
    MemoryInfo m;
    m.total = total_;
    const uint64_t used = static_cast<uint64_t>(pool_.stats().committed_bytes.current);
    m.available = free_ > used ? free_ - used : 0;
    return m;
  }

 private:
  HostPool& pool_;
  uint64_t total_;
  uint64_t free_;
};

// A source that stays alive: sweep() asks every pin, as it does for real sources.
class LiveSource : public SourceGuard {
 public:
  bool alive() const override { return true; }
};

constexpr uint64_t kMinPin = 4 * KiB;
uint64_t pin_size(uint64_t i) { return kMinPin * (1 + (i * 7919) % 64); }  // 4 KiB .. 256 KiB

struct Point {
  std::vector<double> decision_s;    // per repetition: mean seconds per decision
  std::vector<double> end_prompt_s;  // per repetition
  std::vector<double> first_decision_s;  // per repetition
  std::vector<double> sweep_s;       // per repetition
};

class Population {
 public:
  Population(PolicyKind policy, int n) : pool_(make_null_backend(), pool_options(Config{})),
                                         probe_(pool_, 64 * TiB, 32 * TiB), bal_(config(policy), pool_, probe_), n_(n) {
    for (const char* name : {"prompt-a", "prompt-b", "other-c", "other-d"}) models_.push_back(bal_.register_model(name, "cpu"));
    prompt_ = {models_[0], models_[1]};
    bal_.mark_prompt(prompt_);
    for (int i = 0; i < n_; ++i) cast(weight(i));
    end_prompt();
    bal_.mark_prompt(prompt_);
    for (int i = 0; i < n_ / 2; ++i) cast(weight(i));
    if (live_pins() != static_cast<size_t>(n_)) throw std::logic_error("the population does not hold N pins");
  }

  // Mean seconds of `count` decisions, each followed by an untimed new pin.
  double decisions(int count) {
    double total = 0;
    for (int d = 0; d < count; ++d) {
      total += time_seconds([&] {
        if (bal_.free(kMinPin) == 0) throw std::runtime_error("Balancer::free evicted nothing");
      });
      Request r = weight(next_key_++);
      r.kind = Kind::Patches;
      r.bytes = r.key.nbytes = kMinPin;
      cast(r);
    }
    return total / count;
  }

  // One prompt that hits every pin (untimed), then its boundary (timed); the
  // next prompt repeats its first access (untimed) and makes its first
  // decision (timed). Returns the two times.
  std::pair<double, double> prompt_boundary() {
    if (!bal_.prompt_running()) bal_.mark_prompt(prompt_);
    const std::vector<Request> accesses = pin_requests(/*weights_only=*/false);
    for (const Request& r : accesses) cast(r);
    const double boundary = time_seconds([&] { end_prompt(); });
    bal_.mark_prompt(prompt_);
    for (const Request& r : accesses)
      if (r.kind == Kind::Weights) {  // patches went with the boundary
        cast(r);
        break;
      }
    const double first = time_seconds([&] {
      if (bal_.free(kMinPin) == 0) throw std::runtime_error("Balancer::free evicted nothing");
    });
    for (size_t have = live_pins(); have < static_cast<size_t>(n_); ++have) cast(weight(next_key_++));
    return {boundary, first};
  }

  // Ends the running prompt and runs one that hits every weight pin; seconds
  // per access.
  double hit_prompt() {
    if (bal_.prompt_running()) end_prompt();
    bal_.mark_prompt(prompt_);
    const std::vector<Request> accesses = pin_requests(/*weights_only=*/true);
    const double t = time_seconds([&] {
      for (const Request& r : accesses) cast(r);
    });
    end_prompt();
    return t / static_cast<double>(accesses.size());
  }

  double sweep() {
    return time_seconds([&] {
      if (bal_.sweep() != 0) throw std::runtime_error("sweep() found a dead source");
    });
  }

  BalancerStats stats() const { return bal_.stats(); }
  size_t live_pins() const { return static_cast<size_t>(bal_.stats().total.pins); }

 private:
  // A request for each pin held (`weights_only`: its weight pins).
  std::vector<Request> pin_requests(bool weights_only) const {
    std::vector<Request> out;
    for (const Balancer::PinInfo& p : bal_.pins()) {
      if (weights_only && is_patch(p.subset)) continue;
      Request r;
      r.model = p.model;
      r.key = p.key;
      r.bytes = p.bytes;
      r.kind = is_patch(p.subset) ? Kind::Patches : Kind::Weights;
      out.push_back(r);
    }
    return out;
  }
  static Config config(PolicyKind policy) {
    Config c;
    c.policy = policy;
    return c;
  }
  Request weight(uint64_t i) const {
    Request r;
    r.model = models_[i % models_.size()];
    r.key = PinKey{i + 1, 0, pin_size(i)};
    r.bytes = r.key.nbytes;
    return r;
  }
  void cast(const Request& r) {
    Lease l = bal_.acquire(r, [](bool) { return std::make_unique<LiveSource>(); });
    if (!l) throw std::runtime_error("the balancer refused a pin with plenty of RAM");
    if (l.needs_fill()) l.filled();
  }
  void end_prompt() {  // what the pins::end_prompt op runs
    bal_.end_prompt();
    bal_.reclaim(Balancer::kReclaimPerBoundary);
    bal_.relieve();
  }

  HostPool pool_;
  FakeProbe probe_;
  Balancer bal_;
  int n_;
  std::vector<ModelId> models_;
  std::vector<ModelId> prompt_;
  uint64_t next_key_ = uint64_t{1} << 32;  // keys of pins made after the population
};

// The floor under a decision's growth: the ordered-index work one eviction
// does at least, without the balancer. N heap nodes of a pin's size, indexed
// by an ordered map (by_created / by_use) and a hash map (the registry); one
// "decision" erases the oldest from both and frees its node (timed), then a
// new node joins both (untimed), as in Population::decisions. Its growth from
// the smallest to the largest N is what the memory hierarchy adds to O(log n)
// on this machine: the indexes leave the caches as N grows.
double index_floor_seconds(int n, int count) {
  struct Node {
    uint64_t key;
    char payload[248];  // about a Pin with its guard
  };
  std::map<uint64_t, Node*> ordered;
  std::unordered_map<uint64_t, std::unique_ptr<Node>> by_key;
  uint64_t next = 0;
  const auto add = [&] {
    auto node = std::make_unique<Node>();
    node->key = next++;
    ordered.emplace(node->key, node.get());
    by_key.emplace(node->key, std::move(node));
  };
  for (int i = 0; i < n; ++i) add();
  double total = 0;
  for (int d = 0; d < count; ++d) {
    total += time_seconds([&] {
      auto it = ordered.begin();
      const uint64_t key = it->second->key;
      ordered.erase(it);
      by_key.erase(key);
    });
    add();
  }
  return total / count;
}

}  // namespace

int balancer_main(const std::vector<std::string>& args) {
  std::vector<int> counts = {1000, 10000, 100000};
  std::vector<std::string> policies = {"mru", "trace", "lru"};
  int reps = 5, per_rep = 20;
  for (Args a(args); a.next();) {
    if (a.is("--pins")) {
      counts = a.positive_list();
    } else if (a.is("--policies")) {
      policies = a.choice_list({"mru", "lru", "trace", "reuse"});
    } else if (a.is("--reps")) {
      reps = a.positive();
    } else if (a.is("--decisions")) {
      per_rep = a.positive();
    } else {
      a.unknown();
    }
  }
  for (int n : counts)
    if (n < 2) throw std::invalid_argument("--pins: expected counts of at least 2, got " + std::to_string(n));
  const int lo = *std::min_element(counts.begin(), counts.end());
  const int hi = *std::max_element(counts.begin(), counts.end());

  std::printf("pins-bench balancer: null backend, fake probe with plenty of RAM; %d repetitions of %d decisions, "
              "medians\n", reps, per_rep);
  std::printf("decision: Balancer::free(%llu bytes) evicts one pin; end_prompt: Balancer::end_prompt + reclaim(%zu) + "
              "relieve, as the op runs them\n\n", static_cast<unsigned long long>(kMinPin), Balancer::kReclaimPerBoundary);
  std::string result;
  char buf[240];
  // The floor's growth first (index_floor_seconds): what a flat decision cannot beat here.
  std::map<int, std::vector<double>> floor_s;
  for (int n : counts) {
    for (int rep = 0; rep < reps; ++rep) floor_s[n].push_back(index_floor_seconds(n, per_rep));
    std::printf("index floor, %d nodes\n", n);
    print_reps("erase oldest from two indexes", floor_s[n], 1e6, "us");
  }
  const double floor_growth = median(floor_s[hi]) / median(floor_s[lo]);
  std::printf("index floor: from %d to %d nodes one eviction's index work grows %.1fx\n\n", lo, hi, floor_growth);
  std::snprintf(buf, sizeof buf, " floor_growth=%.2f", floor_growth);
  result += buf;
  for (const std::string& policy : policies) {
    const PolicyKind kind = parse_config("policy:" + policy).policy;
    std::map<int, Point> points;
    for (int n : counts) {
      Population pop(kind, n);
      Point& pt = points[n];
      for (int rep = 0; rep < reps; ++rep) pt.decision_s.push_back(pop.decisions(per_rep));
      const int64_t departures = pop.stats().trace_departures;
      for (int rep = 0; rep < reps; ++rep) {
        const auto [boundary, first] = pop.prompt_boundary();
        pt.end_prompt_s.push_back(boundary);
        pt.first_decision_s.push_back(first);
      }
      for (int rep = 0; rep < reps; ++rep) pt.sweep_s.push_back(pop.sweep());
      std::printf("%s, %d pins (%zu at the end; trace departures during decisions: %lld)\n", policy.c_str(), n,
                  pop.live_pins(), static_cast<long long>(departures));
      print_reps("decision", pt.decision_s, 1e6, "us");
      print_reps("end_prompt", pt.end_prompt_s, 1e6, "us");
      print_reps("first decision", pt.first_decision_s, 1e6, "us");
      print_reps("sweep", pt.sweep_s, 1e6, "us");
      std::snprintf(buf, sizeof buf,
                    " decision_us_%s_%d=%.2f end_prompt_us_%s_%d=%.2f first_decision_us_%s_%d=%.2f sweep_us_%s_%d=%.2f",
                    policy.c_str(), n, median(pt.decision_s) * 1e6, policy.c_str(), n, median(pt.end_prompt_s) * 1e6,
                    policy.c_str(), n, median(pt.first_decision_s) * 1e6, policy.c_str(), n,
                    median(pt.sweep_s) * 1e6);
      result += buf;
    }
    {
      // Note [Trace memory]: a hit's cost with few records followed and with all kept.
      std::vector<double> few, all;
      int64_t few_records = 0;
      for (int rep = 0; rep < reps; ++rep) {
        Population fresh(kind, lo);
        few.push_back(fresh.hit_prompt());
        few_records = fresh.stats().trace_records;
      }
      Population pop(kind, lo);
      for (size_t i = 0; i < TraceRecorder::kRecords; ++i) pop.hit_prompt();
      for (int rep = 0; rep < reps; ++rep) all.push_back(pop.hit_prompt());
      const int64_t all_records = pop.stats().trace_records;
      std::printf("%s, %d pins: a prompt of hits, per access\n", policy.c_str(), lo);
      print_reps(("hit, " + std::to_string(few_records) + " records kept").c_str(), few, 1e6, "us");
      print_reps(("hit, " + std::to_string(all_records) + " records kept").c_str(), all, 1e6, "us");
      std::snprintf(buf, sizeof buf, " hit_us_%s_first=%.3f hit_us_%s_kept=%.3f", policy.c_str(), median(few) * 1e6,
                    policy.c_str(), median(all) * 1e6);
      result += buf;
    }
    const double growth = median(points[hi].decision_s) / median(points[lo].decision_s);
    const double end_growth = median(points[hi].end_prompt_s) / median(points[lo].end_prompt_s);
    std::printf("%s: from %d to %d pins a decision grows %.1fx, end_prompt %.1fx\n\n", policy.c_str(), lo, hi, growth,
                end_growth);
    std::snprintf(buf, sizeof buf, " decision_growth_%s=%.2f decision_growth_over_floor_%s=%.2f end_prompt_growth_%s=%.2f",
                  policy.c_str(), growth, policy.c_str(), growth / floor_growth, policy.c_str(), end_growth);
    result += buf;
  }
  std::printf("RESULT%s\n", result.c_str());
  return 0;
}

}  // namespace pins::bench
