// pins::stats: every counter of the balancer and the pool as a dict.
#include <pins/ops/stats.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "ops/common.h"

namespace pins::ops {
namespace {

c10::Dict<std::string, int64_t> stats_kernel() {
  return translate([] {
    Runtime& rt = Runtime::get();
    const PoolStats ps = rt.pool().stats();
    const BalancerStats bs = rt.balancer().stats();
    // The only place BalancerStats and PoolStats fields get string names.
    c10::Dict<std::string, int64_t> d;
    const auto tier = [](int t) { return "evictions.tier" + std::to_string(t + 1); };
    for (const ModelStats& m : bs.models) {
      const std::string prefix = "model." + std::to_string(m.id) + ".";
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
        d.insert(sp + "lock_drops", st.lock_drops);
        d.insert(sp + "inflight_skips", st.inflight_skips);
        for (int t = 0; t < kTiers; ++t) d.insert(sp + tier(t), st.evictions[t]);
      }
      d.insert(prefix + "pins", m.total.pins);
      d.insert(prefix + "bytes", m.total.bytes);
      d.insert(prefix + "refusals", m.refusals);
      d.insert(prefix + "active", static_cast<int64_t>(m.active));
      d.insert(prefix + "in_prompt", static_cast<int64_t>(m.in_prompt));
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
    d.insert("lock_drops", bs.total.lock_drops);
    d.insert("inflight_skips", bs.total.inflight_skips);
    d.insert("refusals", bs.refusals);
    d.insert("busy_misses", bs.busy_misses);
    d.insert("pressure_freed_bytes", bs.pressure_freed_bytes);
    d.insert("relieve_calls", bs.relieve_calls);
    d.insert("trace_departures", bs.trace_departures);
    d.insert("trace_records", bs.trace_records);
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
    d.insert("pool_deferred_frees", ps.deferred_frees);
    d.insert(std::string("backend.") + ps.backend, 1);
    d.insert("monitor", rt.monitor_running() ? 1 : 0);
    return d;
  });
}

}  // namespace

c10::Dict<std::string, int64_t> stats() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pins::stats", "").typed<decltype(stats)>();
  return op.call();
}

}  // namespace pins::ops

TORCH_LIBRARY_FRAGMENT(pins, m) {
  m.def("stats() -> Dict(str, int)", &pins::ops::stats_kernel);
}
