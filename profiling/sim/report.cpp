#include "profiling/sim/report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "csrc/base/size.h"

namespace pins::sim {

using ojson = nlohmann::ordered_json;

const PolicyResult* SequenceResult::find(const std::string& policy) const {
  for (const PolicyResult& p : policies)
    if (p.policy == policy) return &p;
  return nullptr;
}

std::string gib(double bytes, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, bytes / static_cast<double>(GiB));
  return buf;
}

namespace {

int last_period_start(const SequenceResult& r) {
  const int n = static_cast<int>(r.expansion.runs.size());
  return std::max(0, n - r.sequence->period());
}

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

SteadyFigures steady_figures(const SequenceResult& r) {
  SteadyFigures f;
  const int from = last_period_start(r), n = static_cast<int>(r.expansion.runs.size());
  for (int i = from; i < n; ++i) {
    const RunBound& b = r.expansion.runs[i].bound;
    f.used += static_cast<double>(b.used);
    f.cache += static_cast<double>(b.cache);
  }
  const double k = std::max(1, n - from);
  f.used /= k;
  f.cache /= k;
  f.lower_bound = static_cast<double>(window_bound(r.expansion, from, n - from)) / k;
  return f;
}

double steady_disk(const SequenceResult& r, const PolicyResult& p) {
  const int from = last_period_start(r), n = static_cast<int>(p.runs.size());
  double d = 0;
  for (int i = from; i < n; ++i) d += static_cast<double>(p.runs[i].disk_bytes);
  return d / std::max(1, n - from);
}

Checks check(const Trace& t, const SequenceResult& r) {
  Checks c;
  const SteadyFigures f = steady_figures(r);
  c.w_exceeds_c = f.used > f.cache;
  if (const PolicyResult* lru = r.find("lru")) {
    const double ratio = f.used > 0 ? steady_disk(r, *lru) / f.used : 0;
    c.lru_disk_over_w = ratio;
    c.lru_cascade = c.w_exceeds_c && ratio >= 0.9;
  }
  if (const PolicyResult* mru = r.find("mru")) {
    c.mru_steady_run = mru->steady_run < 0 ? 0 : mru->steady_run + 1;
    c.mru_steady_within_3 = mru->steady_run >= 0 && mru->steady_run + 1 <= 3;
  }
  for (const char* name : {"trace", "oracle"}) {
    const PolicyResult* pr = r.find(name);
    if (pr == nullptr) continue;
    // Note [Simulator claims]: every window of one period from the second run.
    const int p = r.sequence->period(), n = static_cast<int>(pr->runs.size());
    double worst = -1e300;
    int at = 0;
    for (int i = r.sequence->repeat_from + p; i + p <= n; ++i) {
      double disk = 0;
      for (int k = i; k < i + p; ++k) disk += static_cast<double>(pr->runs[k].disk_bytes);
      const double excess = disk - (1.05 * static_cast<double>(window_bound(r.expansion, i, p)) +
                                    p * static_cast<double>(t.largest_layer()));
      if (excess > worst) {
        worst = excess;
        at = i + 1;
      }
    }
    if (at == 0) continue;
    if (std::string(name) == "trace") {
      c.trace_worst_excess = worst;
      c.trace_worst_run = at;
      c.trace_within_bound = worst <= 0;
    } else {
      c.oracle_worst_excess = worst;
      c.oracle_within_bound = worst <= 0;
    }
  }
  return c;
}

ojson to_json(const Trace& t, const SequenceResult& r) {
  const Machine& m = t.machine;
  ojson j;
  j["trace"] = t.name;
  j["file"] = t.path;
  j["sequence"] = r.sequence->name;
  j["runs_count"] = r.expansion.runs.size();
  j["period"] = r.sequence->period();
  j["machine"] = {{"ram", m.ram},
                  {"vram", m.vram},
                  {"disk_read_bw", m.disk_read_bw},
                  {"ram_copy_bw", m.ram_copy_bw},
                  {"h2d_bw", m.h2d_bw},
                  {"headroom", m.headroom},
                  {"headroom_derived", m.headroom_derived},
                  {"other_ram", m.other_ram},
                  {"swap", m.swap},
                  {"vram_reserve", m.vram_reserve}};
  ojson models = ojson::array();
  for (const Model& x : t.models)
    models.push_back(
        {{"name", x.name}, {"bytes", x.bytes}, {"layers", x.layers.size()}, {"largest_layer_bytes", x.largest_layer}});
  j["models"] = models;
  j["largest_layer_bytes"] = t.largest_layer();
  j["steady_tolerance_bytes"] = r.tolerance;
  ojson pols = ojson::array();
  for (const PolicyResult& p : r.policies) {
    ojson pj;
    pj["policy"] = p.policy;
    pj["steady_run"] = p.steady_run < 0 ? ojson(nullptr) : ojson(p.steady_run + 1);
    pj["steady_disk_bytes"] = steady_disk(r, p);
    pols.push_back(pj);
  }
  j["policies"] = pols;
  const Checks c = check(t, r);
  ojson cj;
  cj["w_exceeds_c"] = c.w_exceeds_c;
  const auto opt = [](const auto& o) { return o ? ojson(*o) : ojson(nullptr); };
  cj["lru_disk_over_w"] = opt(c.lru_disk_over_w);
  cj["lru_cascade"] = opt(c.lru_cascade);
  cj["mru_steady_run"] = opt(c.mru_steady_run);
  cj["mru_steady_within_3"] = opt(c.mru_steady_within_3);
  cj["trace_worst_excess_bytes"] = opt(c.trace_worst_excess);
  cj["trace_worst_run"] = opt(c.trace_worst_run);
  cj["trace_within_bound"] = opt(c.trace_within_bound);
  cj["oracle_worst_excess_bytes"] = opt(c.oracle_worst_excess);
  cj["oracle_within_bound"] = opt(c.oracle_within_bound);
  j["checks"] = cj;
  ojson runs = ojson::array();
  for (const PolicyResult& p : r.policies) {
    for (const RunResult& rr : p.runs) {
      const RunBound& b = r.expansion.runs[rr.run].bound;
      ojson x;
      x["sequence"] = r.sequence->name;
      x["policy"] = p.policy;
      x["run"] = rr.run + 1;
      x["prompt"] = t.prompts[rr.prompt].name;
      x["disk_bytes"] = rr.disk_bytes;
      x["lower_bound_bytes"] = b.lower_bound;
      x["used_bytes"] = b.used;
      x["cache_bytes"] = b.cache;
      x["pin_capacity_bytes"] = b.pin_capacity;
      x["ram_capacity_bytes"] = b.ram_capacity;
      x["ram_lower_bound_bytes"] = b.ram_lower_bound;
      x["vram_kept_bytes"] = b.kept;
      x["copied_bytes"] = b.copied;
      x["cold_bytes"] = b.cold;
      x["pin_hits"] = rr.pin_hits;
      x["pin_misses"] = rr.pin_misses;
      x["pin_fills"] = rr.pin_fills;
      x["refusals"] = rr.refusals;
      x["monitor_reliefs"] = rr.monitor_reliefs;
      x["pin_hit_bytes"] = rr.pin_hit_bytes;
      x["page_cache_hit_bytes"] = rr.page_cache_hit_bytes;
      x["h2d_bytes"] = rr.h2d_bytes;
      x["pageable_h2d_bytes"] = rr.pageable_h2d_bytes;
      x["evicted_bytes"] = rr.evicted_bytes;
      x["pinned_bytes"] = rr.pinned_bytes;
      x["time_s"] = rr.time_s();
      x["disk_s"] = rr.disk_s;
      x["copy_s"] = rr.copy_s;
      x["h2d_s"] = rr.h2d_s;
      x["steady"] = p.steady_run >= 0 && rr.run >= p.steady_run;
      runs.push_back(x);
    }
  }
  j["runs"] = runs;
  return j;
}

void print_table(std::ostream& os, const Trace& t, const SequenceResult& r) {
  const Machine& m = t.machine;
  const Sequence& s = *r.sequence;
  os << "trace " << t.name << " (" << t.path << ")\n";
  os << "machine: RAM " << gib(m.ram) << " GiB (other " << gib(m.other_ram) << ", headroom " << gib(m.headroom)
     << (m.headroom_derived ? " derived from RAM" : "") << "), VRAM " << gib(m.vram) << " GiB (reserve " << gib(m.vram_reserve) << "), disk "
     << fmt(m.disk_read_bw / 1e9, 1) << " GB/s, RAM copy " << fmt(m.ram_copy_bw / 1e9, 1) << " GB/s, H2D "
     << fmt(m.h2d_bw / 1e9, 1) << " GB/s\n";
  os << "sequence " << s.name << (s.description.empty() ? "" : ": " + s.description) << " (" << r.expansion.runs.size()
     << " runs, period " << s.period() << "); largest layer " << gib(static_cast<double>(t.largest_layer()))
     << " GiB\n\n";
  os << "disk GiB read per run\n";
  os << std::setw(4) << "run"
     << "  " << std::left << std::setw(14) << "prompt" << std::right << std::setw(8) << "W" << std::setw(8) << "C"
     << std::setw(8) << "LB";
  for (const PolicyResult& p : r.policies) os << std::setw(9) << p.policy;
  os << "\n";
  for (size_t i = 0; i < r.expansion.runs.size(); ++i) {
    const RunPlan& plan = r.expansion.runs[i];
    os << std::setw(4) << i + 1 << "  " << std::left << std::setw(14) << t.prompts[plan.prompt].name << std::right
       << std::setw(8) << gib(static_cast<double>(plan.bound.used)) << std::setw(8)
       << gib(static_cast<double>(plan.bound.cache)) << std::setw(8)
       << gib(static_cast<double>(plan.bound.lower_bound));
    for (const PolicyResult& p : r.policies) os << std::setw(9) << gib(static_cast<double>(p.runs[i].disk_bytes));
    os << "\n";
  }
  os << "\n"
     << std::left << std::setw(8) << "policy" << std::right << std::setw(13) << "steady from" << std::setw(12)
     << "disk GiB" << std::setw(11) << "pin hits" << std::setw(12) << "pin misses" << std::setw(10) << "refusals"
     << std::setw(12) << "time s"
     << "   (the last run)\n";
  for (const PolicyResult& p : r.policies) {
    const RunResult& last = p.runs.back();
    os << std::left << std::setw(8) << p.policy << std::right << std::setw(13)
       << (p.steady_run < 0 ? std::string("-") : "run " + std::to_string(p.steady_run + 1)) << std::setw(12)
       << gib(static_cast<double>(last.disk_bytes)) << std::setw(11) << last.pin_hits << std::setw(12)
       << last.pin_misses << std::setw(10) << last.refusals << std::setw(12) << fmt(last.time_s(), 1) << "\n";
  }
  const Checks c = check(t, r);
  os << "\nchecks: W > C in the steady runs: " << (c.w_exceeds_c ? "yes" : "no");
  if (c.lru_disk_over_w)
    os << "; lru reads " << fmt(100 * *c.lru_disk_over_w, 0) << "% of W"
       << (c.w_exceeds_c ? (*c.lru_cascade ? " (cascade)" : " (no cascade)") : "");
  if (c.mru_steady_run)
    os << "; mru steady "
       << (*c.mru_steady_run ? "from run " + std::to_string(*c.mru_steady_run) : std::string("not reached"))
       << (*c.mru_steady_within_3 ? " (within 3)" : " (NOT within 3)");
  if (c.trace_worst_excess)
    os << "; trace minus (1.05 LB + one layer a run), worst window from the second cycle: "
       << gib(*c.trace_worst_excess) << " GiB, runs from " << *c.trace_worst_run
       << (*c.trace_within_bound ? " (holds)" : " (FAILS)");
  if (c.oracle_worst_excess)
    os << "; the oracle: " << gib(*c.oracle_worst_excess) << " GiB"
       << (*c.oracle_within_bound ? "" : " (the bound is out of reach)");
  os << "\n";
}

void write_csv_header(std::ostream& os) {
  os << "trace,sequence,policy,run,prompt,disk_bytes,lower_bound_bytes,used_bytes,cache_bytes,pin_capacity_bytes,"
        "vram_kept_bytes,cold_bytes,pin_hits,pin_misses,pin_fills,refusals,page_cache_hit_bytes,h2d_bytes,"
        "pageable_h2d_bytes,evicted_bytes,pinned_bytes,time_s,steady_run\n";
}

namespace {

std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

void write_csv(std::ostream& os, const Trace& t, const SequenceResult& r) {
  for (const PolicyResult& p : r.policies)
    for (const RunResult& rr : p.runs) {
      const RunBound& b = r.expansion.runs[rr.run].bound;
      os << csv_field(t.name) << ',' << csv_field(r.sequence->name) << ',' << p.policy << ',' << rr.run + 1 << ','
         << csv_field(t.prompts[rr.prompt].name) << ',' << rr.disk_bytes << ',' << b.lower_bound << ',' << b.used << ','
         << b.cache << ',' << b.pin_capacity << ',' << b.kept << ',' << b.cold << ',' << rr.pin_hits << ','
         << rr.pin_misses << ',' << rr.pin_fills << ',' << rr.refusals << ',' << rr.page_cache_hit_bytes << ','
         << rr.h2d_bytes << ',' << rr.pageable_h2d_bytes << ',' << rr.evicted_bytes << ',' << rr.pinned_bytes << ','
         << fmt(rr.time_s(), 3) << ',' << (p.steady_run < 0 ? std::string() : std::to_string(p.steady_run + 1)) << '\n';
    }
}

void write_markdown_header(std::ostream& os) {
  os << "| trace | sequence | W | C | LB | lru | mru | trace | oracle | lru / W | mru steady from | "
        "trace excess | oracle excess |\n";
  os << "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
}

void write_markdown_row(std::ostream& os, const Trace& t, const SequenceResult& r) {
  const SteadyFigures f = steady_figures(r);
  const Checks c = check(t, r);
  const std::string base = t.path.substr(t.path.find_last_of('/') + 1);
  os << "| `" << base.substr(0, base.rfind(".json")) << "` | " << r.sequence->name << " | " << gib(f.used, 1) << " | "
     << gib(f.cache, 1) << " | " << gib(f.lower_bound, 1) << " |";
  for (const char* name : {"lru", "mru", "trace", "oracle"}) {
    const PolicyResult* p = r.find(name);
    os << " " << (p ? gib(steady_disk(r, *p), 1) : std::string("–")) << " |";
  }
  os << " " << (c.lru_disk_over_w ? fmt(*c.lru_disk_over_w, 2) : std::string("–")) << " |";
  os << " "
     << (c.mru_steady_run ? (*c.mru_steady_run ? std::to_string(*c.mru_steady_run) : std::string("no"))
                          : std::string("–"))
     << " |";
  const auto excess = [&os](const std::optional<double>& x, const std::optional<int>& run,
                            const std::optional<bool>& ok) {
    if (!x) {
      os << " – |";
      return;
    }
    os << " " << gib(*x, 1);
    if (run) os << " (run " << *run << ")";
    os << " " << (*ok ? "✓" : "✗") << " |";
  };
  excess(c.trace_worst_excess, c.trace_worst_run, c.trace_within_bound);
  excess(c.oracle_worst_excess, std::nullopt, c.oracle_within_bound);
  os << "\n";
}

void dump_accesses(std::ostream& os, const Trace& t, const SequenceResult& r) {
  const Expansion& e = r.expansion;
  for (const RunPlan& plan : e.runs)
    for (const StepPlan& sp : plan.steps)
      for (size_t i = sp.begin; i < sp.end; ++i) {
        const Access& a = e.accesses[i];
        ojson j;
        j["sequence"] = r.sequence->name;
        j["run"] = a.run + 1;
        j["prompt"] = t.prompts[plan.prompt].name;
        j["step"] = a.step + 1;
        j["model"] = t.models[a.model].name;
        j["key"] = key_name(t, a);
        j["storage"] = a.storage;
        j["bytes"] = a.bytes;
        j["kind"] = a.kind == Kind::Weights ? "weights" : "patches";
        j["resident"] = a.resident;
        j["subset"] = to_string(a.subset());
        if (a.signature) j["signature"] = *a.signature;
        j["pin_capacity_bytes"] = plan.bound.pin_capacity;
        j["ram_capacity_bytes"] = plan.bound.ram_capacity;
        os << j.dump() << '\n';
      }
}

}  // namespace pins::sim
