// pins::stats: every counter of the balancer and the pool as a dict, per model
// by id and by name; pins::summary: the main ones in a few lines.
#include <pins/ops/stats.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "csrc/files/mapped.h"
#include "ops/common.h"

namespace pins::ops {
namespace {

// "1.5 GiB": binary units, one decimal.
std::string human_bytes(int64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::ostringstream os;
  if (u == 0) {
    os << bytes << " B";
  } else {
    os << std::fixed << std::setprecision(1) << v << ' ' << units[u];
  }
  return os.str();
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

// The label of each model's name keys, `model.<label>.`, by position in
// bs.models: its name when that is unique among the registered models (the
// lowest id keeps a repeated name), else `name#id`; empty when even that is
// taken (its id keys remain). A name made only of digits always takes `#id`,
// so it never reads as another model's id.
std::vector<std::string> name_labels(const BalancerStats& bs) {
  std::map<std::string, ModelId> first;  // name -> lowest id (models are by id)
  for (const ModelStats& m : bs.models) first.emplace(m.name, m.id);
  std::set<std::string> taken;
  for (const ModelStats& m : bs.models) taken.insert(std::to_string(m.id));
  std::vector<std::string> out;
  for (const ModelStats& m : bs.models) {
    std::string label = m.name;
    if (first.at(m.name) != m.id || all_digits(m.name)) label = m.name + "#" + std::to_string(m.id);
    if (taken.count(label) != 0) label = m.name + "#" + std::to_string(m.id);
    if (taken.count(label) != 0) label.clear();
    if (!label.empty()) taken.insert(label);
    out.push_back(std::move(label));
  }
  return out;
}

void insert_bypassed(c10::Dict<std::string, int64_t>& d, const std::string& prefix, const int64_t* bypassed,
                     int64_t all) {
  d.insert(prefix + "bypassed", all);
  for (int b = 0; b < kBypassReasons; ++b)
    d.insert(prefix + "bypassed." + to_string(static_cast<Bypass>(b)), bypassed[b]);
}

void insert_model(c10::Dict<std::string, int64_t>& d, const std::string& prefix, const ModelStats& m) {
  const auto tier = [](int t) { return "evictions.tier" + std::to_string(t + 1); };
  for (int s = 0; s < kSubsets; ++s) {
    const SubsetStats& st = m.subsets[s];
    const std::string sp = prefix + to_string(static_cast<Subset>(s)) + ".";
    d.insert(sp + "pins", st.pins);
    d.insert(sp + "bytes", st.bytes);
    d.insert(sp + "hits", st.hits);
    d.insert(sp + "misses", st.misses);
    d.insert(sp + "hit_bytes", st.hit_bytes);
    d.insert(sp + "miss_bytes", st.miss_bytes);
    d.insert(sp + "created", st.created);
    d.insert(sp + "evicted_bytes", st.evicted_bytes);
    d.insert(sp + "dropped", st.dropped);
    d.insert(sp + "invalidated", st.invalidated);
    d.insert(sp + "lock_drops", st.lock_drops);
    d.insert(sp + "inflight_skips", st.inflight_skips);
    d.insert(sp + "content_mismatches", st.content_mismatches);
    for (int t = 0; t < kTiers; ++t) d.insert(sp + tier(t), st.evictions[t]);
  }
  d.insert(prefix + "id", m.id);
  d.insert(prefix + "pins", m.total.pins);
  d.insert(prefix + "bytes", m.total.bytes);
  d.insert(prefix + "hits", m.total.hits);
  d.insert(prefix + "misses", m.total.misses);
  d.insert(prefix + "hit_bytes", m.total.hit_bytes);
  d.insert(prefix + "miss_bytes", m.total.miss_bytes);
  d.insert(prefix + "evictions", m.total.evictions_all());
  d.insert(prefix + "dropped", m.total.dropped);
  d.insert(prefix + "invalidated", m.total.invalidated);
  d.insert(prefix + "content_mismatches", m.total.content_mismatches);
  d.insert(prefix + "refusals", m.refusals);
  insert_bypassed(d, prefix, m.bypassed, m.bypassed_all());
  d.insert(prefix + "active", static_cast<int64_t>(m.active));
  d.insert(prefix + "in_prompt", static_cast<int64_t>(m.in_prompt));
  d.insert(prefix + "device_bytes", m.device_bytes);
  d.insert(prefix + "fast_disk", static_cast<int64_t>(m.options.fast_disk));
  d.insert(prefix + "size", static_cast<int64_t>(m.options.size));
}

c10::Dict<std::string, int64_t> stats_kernel() {
  return translate([] {
    Runtime& rt = Runtime::get();
    const PoolStats ps = rt.pool().stats();
    const BalancerStats bs = rt.balancer().stats();
    // The only place BalancerStats and PoolStats fields get string names.
    c10::Dict<std::string, int64_t> d;
    const auto tier = [](int t) { return "evictions.tier" + std::to_string(t + 1); };
    const std::vector<std::string> labels = name_labels(bs);
    for (size_t i = 0; i < bs.models.size(); ++i) {
      const ModelStats& m = bs.models[i];
      insert_model(d, "model." + std::to_string(m.id) + ".", m);
      if (!labels[i].empty()) insert_model(d, "model." + labels[i] + ".", m);
    }
    for (int s = 0; s < kSubsets; ++s) {
      const std::string sp = std::string(to_string(static_cast<Subset>(s))) + ".";
      d.insert(sp + "pins", bs.subsets[s].pins);
      d.insert(sp + "bytes", bs.subsets[s].bytes);
      d.insert(sp + "hits", bs.subsets[s].hits);
      d.insert(sp + "misses", bs.subsets[s].misses);
    }
    for (int t = 0; t < kTiers; ++t) d.insert(tier(t), bs.total.evictions[t]);
    d.insert("pins", bs.total.pins);
    d.insert("pinned_bytes", bs.total.bytes);
    d.insert("hits", bs.total.hits);
    d.insert("misses", bs.total.misses);
    d.insert("hit_bytes", bs.total.hit_bytes);
    d.insert("miss_bytes", bs.total.miss_bytes);
    d.insert("evictions", bs.total.evictions_all());
    d.insert("evicted_bytes", bs.total.evicted_bytes);
    d.insert("dropped", bs.total.dropped);
    d.insert("invalidated", bs.total.invalidated);
    d.insert("lock_drops", bs.total.lock_drops);
    d.insert("inflight_skips", bs.total.inflight_skips);
    d.insert("content_mismatches", bs.total.content_mismatches);
    d.insert("refusals", bs.refusals);
    d.insert("busy_misses", bs.busy_misses);
    insert_bypassed(d, "", bs.bypassed, bs.bypassed_all());
    d.insert("plain_copies", bs.plain_copies);
    d.insert("pressure_freed_bytes", bs.pressure_freed_bytes);
    d.insert("relieve_calls", bs.relieve_calls);
    d.insert("trace_departures", bs.trace_departures);
    d.insert("trace_records", bs.trace_records);
    d.insert("trace_bytes", bs.trace_bytes);
    d.insert("reuse_keys", bs.reuse_keys);
    d.insert("prompt", static_cast<int64_t>(bs.prompt));
    d.insert("models", static_cast<int64_t>(bs.models.size()));
    d.insert("committed_bytes", ps.committed_bytes.current);
    d.insert("locked_bytes", ps.locked_bytes.current);
    d.insert("reserved_bytes", ps.reserved_bytes.current);
    d.insert("pool_allocated_bytes", ps.allocated_bytes.current);
    d.insert("pool_requested_bytes", ps.requested_bytes.current);
    d.insert("pool_committed_peak_bytes", ps.committed_bytes.peak);
    d.insert("pool_registrations", ps.registrations);
    d.insert("pool_lock_ns", ps.lock_ns);
    d.insert("pool_refusals", ps.refusals);
    d.insert("lock_failures", ps.lock_failures);  // Note [Refused page-locks] (csrc/pool/pool.h)
    d.insert("pool_deferred_frees", ps.deferred_frees);
    d.insert(std::string("backend.") + ps.backend, 1);
    d.insert("monitor", rt.monitor_running() ? 1 : 0);
    // Note [Prewarm] (csrc/balancer/prewarm.h).
    const Runtime::PrewarmStatus pw = rt.prewarm_status();
    d.insert("prewarm", pw.running ? 1 : 0);
    d.insert("prewarm_busy", pw.busy ? 1 : 0);
    d.insert("prewarm_rounds", static_cast<int64_t>(pw.rounds));
    d.insert("prewarm_errors", static_cast<int64_t>(pw.errors));
    d.insert("prewarmed_bytes", ps.prewarmed_bytes.current);
    d.insert("prewarm_bytes", ps.prewarmed_bytes.allocated);
    d.insert("prewarm_served_bytes", ps.prewarm_served_bytes);
    // Note [File-backed pins] (csrc/files/mapped.h).
    const files::FileFillStats fs = files::file_fill_stats();
    d.insert("file_fills", static_cast<int64_t>(fs.fills));
    d.insert("file_fill_bytes", static_cast<int64_t>(fs.bytes));
    d.insert("file_fills_direct", static_cast<int64_t>(fs.direct));
    d.insert("file_fills_cached", static_cast<int64_t>(fs.cached));
    d.insert("file_fills_written", static_cast<int64_t>(fs.written));
    d.insert("mapped_files", static_cast<int64_t>(fs.mapped_files));
    d.insert("file_changes", static_cast<int64_t>(fs.changes));
    // Note [Shared pins] (csrc/share/host_share.h): present with share:true;
    // share_state 0 (and share_state.<reason> 1) when this process pins
    // privately because it could not attach ("When sharing fails").
    if (rt.config().share) {
      const Runtime::ShareState& st = rt.share_state();
      d.insert("share_state", st.shared ? 1 : 0);
      if (!st.shared) d.insert("share_state." + st.reason, 1);
      const share::ShareStats ss = rt.share() != nullptr ? rt.share()->stats() : share::ShareStats{};
      d.insert("share_joins", static_cast<int64_t>(ss.joins));
      d.insert("share_fills", static_cast<int64_t>(ss.fills));
      d.insert("share_published", static_cast<int64_t>(ss.published));
      d.insert("share_withdrawn", static_cast<int64_t>(ss.withdrawn));
      d.insert("share_waits", static_cast<int64_t>(ss.waits));
      d.insert("share_busy", static_cast<int64_t>(ss.busy));
      d.insert("share_refused", static_cast<int64_t>(ss.refused));
      d.insert("share_errors", static_cast<int64_t>(ss.errors));
      d.insert("share_torn", static_cast<int64_t>(ss.torn));
      d.insert("share_dead_slots", static_cast<int64_t>(ss.dead_slots));
      d.insert("share_lock_timeouts", static_cast<int64_t>(ss.lock_timeouts));
      d.insert("share_entries", static_cast<int64_t>(ss.entries));
      d.insert("share_bytes", static_cast<int64_t>(ss.bytes));
      d.insert("share_processes", static_cast<int64_t>(ss.processes));
    }
    return d;
  });
}

// "3 bypassed (empty 1, refused 2)"; "0 bypassed".
std::string bypassed_text(const int64_t* bypassed, int64_t all) {
  std::ostringstream os;
  os << all << " bypassed";
  const char* sep = " (";
  for (int b = 0; b < kBypassReasons; ++b) {
    if (bypassed[b] == 0) continue;
    os << sep << to_string(static_cast<Bypass>(b)) << ' ' << bypassed[b];
    sep = ", ";
  }
  if (all != 0) os << ')';
  return os.str();
}

std::string hit_rate(int64_t hits, int64_t misses) {
  if (hits + misses == 0) return "no casts yet";
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << 100.0 * static_cast<double>(hits) / static_cast<double>(hits + misses)
     << "% hit rate";
  return os.str();
}

std::string summary_kernel() {
  return translate([] {
    Runtime& rt = Runtime::get();
    const PoolStats ps = rt.pool().stats();
    const BalancerStats bs = rt.balancer().stats();
    std::ostringstream os;
    os << "pins: " << bs.total.pins << " pins, " << human_bytes(bs.total.bytes) << " pinned (";
    for (int s = 0; s < kSubsets; ++s)
      os << (s ? ", " : "") << to_string(static_cast<Subset>(s)) << ' ' << bs.subsets[s].pins << " / "
         << human_bytes(bs.subsets[s].bytes);
    os << "); " << (bs.prompt ? "a prompt is running" : "no prompt running") << '\n';
    os << "casts: " << bs.total.hits << " hits, " << bs.total.misses << " misses ("
       << hit_rate(bs.total.hits, bs.total.misses) << "), " << bypassed_text(bs.bypassed, bs.bypassed_all()) << ", "
       << bs.plain_copies << " plain copies\n";
    os << "freed: " << bs.total.evictions_all() << " evictions (" << human_bytes(bs.total.evicted_bytes) << "), "
       << bs.total.dropped << " dropped (" << bs.total.invalidated << " invalidated), " << bs.refusals
       << " refusals; pool " << human_bytes(ps.committed_bytes.current) << " committed, "
       << human_bytes(ps.locked_bytes.current) << " page-locked\n";
    if (rt.config().share) {
      const Runtime::ShareState& st = rt.share_state();
      if (st.shared) os << "shared pins: on, " << rt.share()->dir() << '\n';
      else os << "shared pins: off in this process (" << st.message << ")\n";
    }
    for (const ModelStats& m : bs.models) {
      os << "model " << m.id << " '" << m.name << "' (" << m.load_device << (m.options.fast_disk ? ", fast_disk" : "")
         << "): " << m.total.pins << " pins, " << human_bytes(m.total.bytes) << ", " << m.total.hits << " hits, "
         << m.total.misses << " misses, " << bypassed_text(m.bypassed, m.bypassed_all());
      if (m.active) os << ", active";
      if (m.in_prompt) os << ", in prompt";
      os << '\n';
    }
    if (bs.models.empty()) os << "no models registered\n";
    return os.str();
  });
}

int64_t locked_bytes_kernel() {
  return translate([] { return static_cast<int64_t>(Runtime::get().pool().stats().locked_bytes.current); });
}

static_assert(std::is_same_v<decltype(stats_kernel), decltype(stats)>);
static_assert(std::is_same_v<decltype(locked_bytes_kernel), decltype(locked_bytes)>);
static_assert(std::is_same_v<decltype(summary_kernel), decltype(summary)>);

}  // namespace

c10::Dict<std::string, int64_t> stats() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::stats", "").typed<decltype(stats)>();
  return op.call();
}

std::string summary() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::summary", "").typed<decltype(summary)>();
  return op.call();
}

int64_t locked_bytes() {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::locked_bytes", "").typed<decltype(locked_bytes)>();
  return op.call();
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("stats() -> Dict(str, int)", &pins::ops::stats_kernel);
  m.def("summary() -> str", &pins::ops::summary_kernel);
  m.def("locked_bytes() -> int", &pins::ops::locked_bytes_kernel);
}
