#include "profiling/sim/suite.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "csrc/base/size.h"
#include "profiling/sim/expand.h"
#include "profiling/sim/report.h"

namespace pins::sim {

namespace {

// num / den; with den 0: infinity, or 1 when num is 0 too.
double ratio(double num, double den) { return den > 0 ? num / den : (num > 0 ? INFINITY : 1.0); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

SuiteRow replay_scenario(const Scenario& s, const std::vector<std::string>& policies, const ReplayOptions& o) {
  const Sequence& seq = s.trace.sequences.front();
  const Expansion e = expand(s.trace, seq, seq.runs);
  SuiteRow row;
  row.runs = seq.runs - 1;
  row.allowance = s.trace.largest_layer() * static_cast<uint64_t>(row.runs);
  row.ram_bound = window_bound(e, 1, row.runs, /*ram=*/true);
  for (const std::string& p : policies) {
    const PolicyResult r = replay(s.trace, seq, e, p, o);
    std::vector<uint64_t> runs;
    runs.reserve(r.runs.size());
    for (const RunResult& run : r.runs) runs.push_back(run.disk_bytes);
    const uint64_t disk = runs.empty() ? 0 : std::accumulate(runs.begin() + 1, runs.end(), uint64_t{0});
    row.disk.push_back(disk);
    row.run_disk.push_back(std::move(runs));
    if (p == "oracle")
      row.thrashing = row.runs > 0 && disk / static_cast<uint64_t>(row.runs) > s.trace.machine.ram;
  }
  return row;
}

int SuiteResult::policy_index(const std::string& p) const {
  const auto it = std::find(policies.begin(), policies.end(), p);
  return it == policies.end() ? -1 : static_cast<int>(it - policies.begin());
}

SuiteResult run_suite(uint64_t seed, int count, const std::vector<std::string>& policies,
                      const std::vector<model_params::Model>& params, const ReplayOptions& options, int threads,
                      SuiteKind kind) {
  SuiteResult r;
  r.seed = seed;
  r.kind = kind;
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
        r.scenarios[i] = make_scenario(seed, i, params, kind);
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
    if (std::none_of(r.scenarios.begin(), r.scenarios.end(),
                     [&](const Scenario& s) { return static_cast<int>(s.pattern) == pat; }))
      continue;
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
  // The total over the scenarios of the first eight patterns only (the suite
  // without issue 39's shapes).
  double first8 = 0, first8_oracle = 0;
  for (size_t i = 0; i < r.rows.size(); ++i)
    if (static_cast<int>(r.scenarios[i].pattern) < static_cast<int>(Pattern::AppearRepeat)) {
      first8 += static_cast<double>(r.rows[i].disk[d]);
      first8_oracle += static_cast<double>(r.rows[i].disk[oracle]);
    }
  std::snprintf(line, sizeof line,
                "RESULT policy=%s seed=%llu scenarios=%zu vs_oracle=%.3f vs_oracle_steady=%.3f thrashing=%d "
                "median=%.3f p90=%.3f worst=%.3f over_mru=%d over_lru=%d over_min=%d worst_over_mru_layers=%.1f "
                "worst_over_lru_layers=%.1f worst_over_min_layers=%.1f oracle_zero_over=%d "
                "below_oracle=%d below_ram_bound=%d targets=%s kind=%s vs_oracle_first8=%.3f\n",
                default_policy.c_str(), static_cast<unsigned long long>(r.seed), r.scenarios.size(), f.vs_oracle,
                f.vs_oracle_steady, f.thrashing, f.median, f.p90, f.worst, f.over_mru, f.over_lru, f.over_min,
                f.worst_over_mru, f.worst_over_lru, f.worst_over_min, f.oracle_zero_over, f.below_oracle,
                f.below_ram_bound, meets_targets(f) ? "met" : "missed", to_string(r.kind), ratio(first8, first8_oracle));
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

void write_suite_runs_csv(std::ostream& os, const SuiteResult& r) {
  os << "seed,scenario,name,pattern,policy,run,disk_bytes,layer_bytes\n";
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const Scenario& s = r.scenarios[i];
    const uint64_t layer = s.trace.largest_layer();
    for (size_t p = 0; p < r.policies.size(); ++p)
      for (size_t run = 0; run < r.rows[i].run_disk[p].size(); ++run)
        os << r.seed << ',' << i << ',' << s.name << ',' << to_string(s.pattern) << ',' << r.policies[p] << ','
           << run << ',' << r.rows[i].run_disk[p][run] << ',' << layer << '\n';
  }
}

}  // namespace pins::sim
