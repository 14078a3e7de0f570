#include "profiling/sim/replay.h"

#include <algorithm>
#include <limits>
#include <list>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "csrc/pool/backend.h"
#include "csrc/pool/pool.h"
#include "csrc/balancer/balancer.h"
#include "csrc/base/saturate.h"
#include "csrc/system/sysmem.h"

namespace pins::sim {

namespace {

// Note [Simulator memory model]: RAM as the balancer sees it.
class ModelledProbe final : public MemoryProbe {
 public:
  ModelledProbe(HostPool& pool, const Machine& m) : pool_(pool), m_(m) {}
  MemoryInfo read() override {
    MemoryInfo i;
    i.total = m_.ram;
    i.available = sub_sat(m_.ram, app + committed());
    i.swap_total = m_.swap;
    i.swap_free = m_.swap;
    return i;
  }
  uint64_t committed() const { return static_cast<uint64_t>(pool_.stats().committed_bytes.current); }
  uint64_t app = 0;  // other_ram + the prompt's LoRA bytes

 private:
  HostPool& pool_;
  const Machine& m_;
};

// The OS page cache: LRU over whole weights.
class PageCache {
 public:
  bool touch(uint64_t key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    lru_.splice(lru_.begin(), lru_, it->second);
    return true;
  }
  void insert(uint64_t key, uint64_t bytes, uint64_t capacity) {
    if (bytes > capacity || index_.count(key)) return;
    lru_.push_front({key, bytes});
    index_[key] = lru_.begin();
    used_ += bytes;
    shrink(capacity);
  }
  // Takes `key` out (a pin filled from the cache dropped it there); whether it was in.
  bool take(uint64_t key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    used_ -= it->second->second;
    lru_.erase(it->second);
    index_.erase(it);
    return true;
  }
  void shrink(uint64_t capacity) {
    while (used_ > capacity && !lru_.empty()) {
      used_ -= lru_.back().second;
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }

 private:
  std::list<std::pair<uint64_t, uint64_t>> lru_;  // most recent first
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, uint64_t>>::iterator> index_;
  uint64_t used_ = 0;
};

uint64_t lora_bytes(const Trace& t, const Prompt& p) {
  std::set<int> used;
  for (const Step& s : p.steps) used.insert(s.loras.begin(), s.loras.end());
  uint64_t b = 0;
  for (int l : used) b += t.loras[l].bytes;
  return b;
}

PolicyResult replay_balancer(const Trace& t, const Expansion& e, PolicyKind kind, const ReplayOptions& o,
                             bool clairvoyant = false) {
  const Machine& mach = t.machine;
  // As the runtime builds a process's configuration (Note [Derived budget]):
  // pin_reserve from the machine's RAM, the headroom the trace's or derived
  // the same way (Machine::headroom_derived), then --conf.
  Config base;
  base.policy = kind;
  base.headroom = mach.headroom;
  base.pin_reserve = derive_budget(mach.ram, 0).pin_reserve;
  const Config c = parse_config(o.conf, base);
  PoolOptions po = pool_options(c);
  po.retain_free = 0;
  HostPool pool(make_null_backend(), po);
  ModelledProbe probe(pool, mach);
  Balancer bal(c, pool, probe);
  // "clairvoyant": the reuse policy told each key's next access (the balancer's
  // clock counts acquire() calls, one per access here).
  std::unordered_map<uint64_t, std::vector<uint64_t>> uses;
  if (clairvoyant) {
    for (size_t i = 0; i < e.accesses.size(); ++i) uses[e.accesses[i].storage].push_back(i + 1);
    bal.set_reuse_future([&uses](const PinKey& k, uint64_t now) {
      auto it = uses.find(k.storage);
      if (it == uses.end()) return ReuseHistory::kNever;
      auto next = std::upper_bound(it->second.begin(), it->second.end(), now);
      return next == it->second.end() ? ReuseHistory::kNever : *next;
    });
  }
  std::vector<ModelId> ids;
  for (const Model& m : t.models) ids.push_back(bal.register_model(m.name, "cuda:0"));
  PageCache cache;
  const auto cache_capacity = [&] { return sub_sat(mach.ram, probe.app + probe.committed()); };

  PolicyResult out;
  out.policy = to_string(kind);
  // What set_device_bytes last said of each model (none: nothing yet).
  std::vector<std::optional<uint64_t>> said(t.models.size());
  const auto say_device_bytes = [&](const StepPlan& sp, bool others) {
    if (!o.device_bytes) return;
    for (size_t m = 0; m < t.models.size(); ++m) {
      if (others == (static_cast<int>(m) == sp.model)) continue;
      const uint64_t now = sp.device_after[m];
      if (said[m] == now || (!said[m] && now == 0)) continue;
      bal.set_device_bytes(ids[m], now, t.models[m].bytes);
      said[m] = now;
    }
  };
  for (const RunPlan& plan : e.runs) {
    RunResult rr;
    rr.run = plan.run;
    rr.prompt = plan.prompt;
    probe.app = mach.other_ram + lora_bytes(t, t.prompts[plan.prompt]);
    cache.shrink(cache_capacity());
    const int64_t evicted_before = bal.stats().total.evicted_bytes;
    if (o.mark_upfront) {
      std::vector<ModelId> marks;
      for (int m : plan.models) marks.push_back(ids[m]);
      bal.mark_prompt(marks);
    }
    // The bytes of a weight no pin holds: from the page cache or the disk.
    const auto read_source = [&](const Access& a) {
      if (a.kind != Kind::Weights) return;  // a LoRA factor: process RAM
      if (cache.touch(a.storage)) {
        rr.page_cache_hit_bytes += a.bytes;
        return;
      }
      rr.disk_bytes += a.bytes;
      rr.disk_s += static_cast<double>(a.bytes) / mach.disk_read_bw;
      cache.insert(a.storage, a.bytes, cache_capacity());
    };
    // A new pin of a weight, filled from its file (Note [File-backed pins],
    // csrc/files/mapped.h): from the page cache when it holds the weight, which
    // then drops it, else from the disk without caching it. With
    // --buffered-fills, through the page cache as an unpinned read.
    const auto fill_source = [&](const Access& a) {
      if (!o.direct_fills) return read_source(a);
      if (a.kind != Kind::Weights) return;
      if (cache.take(a.storage)) {
        rr.page_cache_hit_bytes += a.bytes;
        return;
      }
      rr.disk_bytes += a.bytes;
      rr.disk_s += static_cast<double>(a.bytes) / mach.disk_read_bw;
    };
    const auto to_device = [&](uint64_t bytes, bool locked) {
      rr.h2d_bytes += bytes;
      rr.h2d_s += static_cast<double>(bytes) / mach.h2d_bw;
      if (!locked) {
        rr.pageable_h2d_bytes += bytes;
        rr.copy_s += static_cast<double>(bytes) / mach.ram_copy_bw;
      }
    };
    for (const StepPlan& sp : plan.steps) {
      const ModelId id = ids[sp.model];
      if (!o.mark_upfront) bal.mark_prompt({id});
      // ops/models: set_active is a node boundary (relieve); so is end_prompt.
      bal.set_active(id, true);
      if (o.relieve) bal.relieve();
      say_device_bytes(sp, true);  // what the step's unloads left
      for (size_t i = sp.begin; i < sp.end; ++i) {
        const Access& a = e.accesses[i];
        Request r;
        r.model = id;
        r.key = PinKey{a.storage, 0, a.bytes};
        r.bytes = a.bytes;
        r.kind = a.kind;
        r.resident = a.resident;
        r.signature = a.signature;
        // lru models the usual application (Note [Simulator lru]): it pins
        // streamed weights only and copies device-resident ones straight from
        // the page cache.
        Lease l = kind == PolicyKind::Lru && a.resident ? Lease() : bal.acquire(r);
        if (l && l.hit()) {
          rr.pin_hits++;
          rr.pin_hit_bytes += a.bytes;
          to_device(a.bytes, pool.is_locked(l.data()));
        } else if (l) {
          rr.pin_misses++;
          rr.pin_fills++;
          cache.shrink(cache_capacity());
          fill_source(a);
          rr.copy_s += static_cast<double>(a.bytes) / mach.ram_copy_bw;  // source -> pin
          to_device(a.bytes, pool.is_locked(l.data()));
          l.filled();
        } else {
          rr.pin_misses++;
          if (!(kind == PolicyKind::Lru && a.resident)) rr.refusals++;
          read_source(a);
          to_device(a.bytes, false);
        }
        if (o.monitor && probe.read().available < (o.monitor_at_headroom ? c.headroom : bal.pressure_line())) {
          rr.monitor_reliefs++;
          bal.relieve();
        }
      }
      say_device_bytes(sp, false);  // what its load keeps
      bal.set_active(id, false);
      if (o.relieve) bal.relieve();
    }
    bal.end_prompt();
    if (o.relieve) bal.relieve();
    const BalancerStats stats = bal.stats();
    rr.evicted_bytes = static_cast<uint64_t>(stats.total.evicted_bytes - evicted_before);
    rr.pinned_bytes = static_cast<uint64_t>(stats.total.bytes);
    out.runs.push_back(rr);
  }
  return out;
}

}  // namespace

PolicyResult replay_oracle(const Trace& t, const Expansion& e, OracleCapacity capacity) {
  const Machine& mach = t.machine;
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  const size_t n = e.accesses.size();
  std::vector<size_t> next(n, kNever);
  {
    std::unordered_map<uint64_t, size_t> later;
    for (size_t i = n; i-- > 0;) {
      const Access& a = e.accesses[i];
      if (a.kind != Kind::Weights) continue;
      auto it = later.find(a.storage);
      if (it != later.end()) next[i] = it->second;
      later[a.storage] = i;
    }
  }
  struct Entry {
    uint64_t bytes;
    size_t next;
  };
  std::unordered_map<uint64_t, Entry> cached;
  // Farthest next use first; never-again ties larger first.
  using Order = std::tuple<size_t, uint64_t, uint64_t>;  // next, bytes, storage
  std::set<Order, std::greater<Order>> order;
  uint64_t used = 0;
  const auto evict = [&](std::set<Order, std::greater<Order>>::iterator it) {
    const uint64_t key = std::get<2>(*it);
    used -= std::get<1>(*it);
    cached.erase(key);
    return order.erase(it);
  };

  PolicyResult out;
  out.policy = capacity == OracleCapacity::Ram ? "oracle" : "oracle-pins";
  for (const RunPlan& plan : e.runs) {
    RunResult rr;
    rr.run = plan.run;
    rr.prompt = plan.prompt;
    const uint64_t cap = capacity == OracleCapacity::Ram ? plan.bound.ram_capacity : plan.bound.pin_capacity;
    uint64_t evicted = 0;
    while (used > cap) {
      evicted += std::get<1>(*order.begin());
      evict(order.begin());
    }
    for (const StepPlan& sp : plan.steps) {
      for (size_t i = sp.begin; i < sp.end; ++i) {
        const Access& a = e.accesses[i];
        const double b = static_cast<double>(a.bytes);
        rr.h2d_bytes += a.bytes;
        rr.h2d_s += b / mach.h2d_bw;
        if (a.kind != Kind::Weights) {  // a LoRA factor: a pageable copy from RAM
          rr.pin_misses++;
          rr.refusals++;
          rr.pageable_h2d_bytes += a.bytes;
          rr.copy_s += b / mach.ram_copy_bw;
          continue;
        }
        auto hit = cached.find(a.storage);
        if (hit != cached.end()) {
          rr.pin_hits++;
          rr.pin_hit_bytes += a.bytes;
          order.erase({hit->second.next, hit->second.bytes, a.storage});
          hit->second.next = next[i];
          order.insert({next[i], a.bytes, a.storage});
          continue;
        }
        rr.pin_misses++;
        rr.disk_bytes += a.bytes;
        rr.disk_s += b / mach.disk_read_bw;
        rr.copy_s += b / mach.ram_copy_bw;  // into the pin, or the pageable staging copy
        bool keep = a.bytes <= cap && next[i] != kNever;
        if (keep) {
          uint64_t room = cap - used;
          auto it = order.begin();
          size_t nearest_victim = kNever;
          while (room < a.bytes && it != order.end()) {
            room += std::get<1>(*it);
            nearest_victim = std::get<0>(*it);
            ++it;
          }
          keep = room >= a.bytes && (nearest_victim == kNever || nearest_victim > next[i]);
        }
        if (!keep) {
          rr.refusals++;
          rr.pageable_h2d_bytes += a.bytes;
          continue;
        }
        rr.pin_fills++;
        while (cap - used < a.bytes) {
          evicted += std::get<1>(*order.begin());
          evict(order.begin());
        }
        cached[a.storage] = {a.bytes, next[i]};
        order.insert({next[i], a.bytes, a.storage});
        used += a.bytes;
      }
    }
    rr.evicted_bytes = evicted;
    rr.pinned_bytes = used;
    out.runs.push_back(rr);
  }
  return out;
}

PolicyResult replay(const Trace& t, const Sequence& seq, const Expansion& e, const std::string& policy,
                    const ReplayOptions& o) {
  PolicyResult r;
  if (policy == "oracle") r = replay_oracle(t, e, OracleCapacity::Ram);
  else if (policy == "oracle-pins") r = replay_oracle(t, e, OracleCapacity::Pins);
  else if (policy == "mru") r = replay_balancer(t, e, PolicyKind::Mru, o);
  else if (policy == "lru") r = replay_balancer(t, e, PolicyKind::Lru, o);
  else if (policy == "trace") r = replay_balancer(t, e, PolicyKind::Trace, o);
  else if (policy == "reuse") r = replay_balancer(t, e, PolicyKind::Reuse, o);
  else if (policy == "clairvoyant") {
    r = replay_balancer(t, e, PolicyKind::Reuse, o, /*clairvoyant=*/true);
    r.policy = "clairvoyant";
  }
  else throw std::invalid_argument("--policy: expected lru, mru, trace, reuse, clairvoyant, oracle or oracle-pins, got \"" + policy + "\"");
  r.steady_run = steady_run(seq, r.runs, steady_tolerance(e));
  return r;
}

uint64_t steady_tolerance(const Expansion& e) {
  uint64_t w = 0;
  for (const RunPlan& p : e.runs) w = std::max(w, p.bound.used);
  return std::max<uint64_t>(w / 100, 1);
}

int steady_run(const Sequence& seq, const std::vector<RunResult>& runs, uint64_t tol) {
  const int p = seq.period();
  const int n = static_cast<int>(runs.size());
  for (int r = 0; r + p < n; ++r) {
    bool ok = true;
    for (int s = r; s + p < n && ok; ++s) {
      const uint64_t a = runs[s].disk_bytes, b = runs[s + p].disk_bytes;
      ok = (a > b ? a - b : b - a) <= tol;
    }
    if (ok) return r;
  }
  return -1;
}

}  // namespace pins::sim
