// A model-based randomized test of the ops (docs/RELIABILITY.md): a long random
// sequence of every op, through the C++ entry points (include/pins/ops.h),
// checked after each step against a reference model the test keeps.
//
// What is checked:
// - every cast's result (cast_to_device, its out= form, cast_many_to_device) is
//   bit-exact against a plain torch copy of the source's bytes now, and never
//   shares the source's storage: a stale pin is never served;
// - a cast is a hit only when the reference allows one: the same model, source
//   (or group), kind and signature were cast since the source's bytes last
//   changed and the model's pins were last dropped (Note [Pin validity]); and an
//   immediate repeat of a cast that created a pin hits unless that pin was
//   evicted or dropped meanwhile;
// - accounting, from one pins::stats() after every step: each subset's pins and
//   bytes are the sum over the models, the totals the sum over the subsets, each
//   model's counters the sum of its subsets'; per model hits + misses +
//   bypassed.empty equals the casts the test issued for it, misses equal pins
//   created plus casts bypassed for a reason other than `empty`, and pins equal
//   pins created less evictions and drops; the keys by name equal the keys by
//   id; no key of a forgotten model; committed >= allocated >= requested bytes,
//   page-locked <= committed <= the pool's cap; lifetime totals (forgotten
//   models included) never decrease; with no other thread running, the
//   pool's requested bytes equal the pinned bytes.
//
// Several threads: in bursts, worker "worlds" (each with its own models and
// sources, so each can keep its exact per-model reference) run the same random
// steps at once, while their free_pins, configure and prompt and node
// boundaries act on every model.
//
// PINS_SEED replays a run (printed at the start; the order of a burst's threads
// is not replayed, the sequential steps are); PINS_MODEL_OPS sets the number of
// operations (default 100000), PINS_MODEL_THREADS the workers of a burst
// (default 3; 0: no bursts).
#include <pins/ops.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

const c10::Device kCpu(c10::kCPU);
// The pool's cap, set before the runtime is built (main below): small enough
// that the pool refuses blocks (`bypassed.pool`) in a run.
constexpr int64_t kCap = 96ll << 20;
const char* const kSubsets[] = {"weights", "patches", "weights-loaded", "patches-loaded"};
// Bypass reasons: every `bypassed.<reason>` key of the stats (check_stats reads them).
std::vector<std::string> g_reasons;
// Lifetime totals: forgotten models count too, so they never decrease.
const char* const kMonotonic[] = {"hits",
                                  "misses",
                                  "hit_bytes",
                                  "miss_bytes",
                                  "evictions",
                                  "evicted_bytes",
                                  "dropped",
                                  "invalidated",
                                  "bypassed",
                                  "bypassed.empty",
                                  "bypassed.refused",
                                  "bypassed.pool",
                                  "bypassed.busy",
                                  "bypassed.raced",
                                  "bypassed.forgotten",
                                  "refusals",
                                  "plain_copies",
                                  "busy_misses",
                                  "relieve_calls",
                                  "pressure_freed_bytes",
                                  "prewarm_bytes",
                                  "prewarm_served_bytes",
                                  "pool_registrations",
                                  "weights.hits",
                                  "patches.hits",
                                  "weights-loaded.hits",
                                  "patches-loaded.hits"};

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

using Stats = c10::Dict<std::string, int64_t>;

int64_t get(const Stats& s, const std::string& key) {
  auto it = s.find(key);
  if (it == s.end()) throw std::runtime_error("stats has no key '" + key + "'");
  return it->value();
}

std::string mkey(int64_t m, const std::string& rest) {
  return "model." + std::to_string(m) + "." + rest;
}

// A source the test casts: a tensor of its own, or a view into an arena (a
// larger tensor whose views take disjoint byte ranges, so invalidating one view
// drops exactly its pins).
struct Source {
  int id = 0;
  at::Tensor t;
  at::Tensor arena;  // defined for a view
  bool inference = false;
  uint64_t storage = 0, offset = 0, span = 0;  // the bytes it reaches, as ops/cast_path.cpp computes them
};

struct Model {
  int64_t id = 0;
  std::string name;
  int64_t casts = 0;  // casts this test issued with this model
};

// What the reference allows to hit: a (model, sources, kind, signature) cast
// since the bytes and the model's pins last changed.
using HitKey = std::tuple<int64_t, std::vector<int>, bool, std::optional<int64_t>>;

class World {
 public:
  World(int index, uint64_t seed, bool solo) : index_(index), rng_(seed), solo_(solo) {
    gen_ = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x5eed);
  }

  // One random operation and the checks after it. Returns false on a failure
  // (recorded with the recent operations).
  void step(int64_t n);
  void set_solo(bool solo) { solo_ = solo; }
  const std::string& failure() const { return failure_; }
  bool failed() const { return !failure_.empty(); }
  int64_t ops() const { return ops_; }
  // Every model and source dropped (the end of the test).
  void clear();
  std::map<std::string, int64_t> counts;  // operations by name

 private:
  // ---- the operations
  void op_register();
  void op_forget();
  void op_cast(bool repeat);
  void op_cast_out();
  void op_cast_many();
  void op_plain_copy();
  void op_write_tensor();
  void op_write_hidden();  // .data or an inference tensor, then invalidate
  void op_invalidate_arena();
  void op_invalidate_model();
  void op_replace_source();
  void op_boundary();
  void op_free();
  void op_configure();
  void op_forgotten_model_cast();

  // ---- helpers
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  // A source, mostly among the first few (so that casts repeat and hit).
  int pick_source() {
    const int n = static_cast<int>(sources_.size());
    return chance(0.7) ? pick(std::min(n, 6)) : pick(n);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  at::Tensor fresh(at::IntArrayRef sizes, c10::ScalarType dtype);
  Source make_source();
  at::Tensor new_arena();
  void forget_bytes(const Source& s, bool whole_storage);  // the reference after a write
  std::optional<c10::ScalarType> pick_dtype(const Source& s);
  std::optional<int64_t> pick_signature() { return chance(0.5) ? std::nullopt : std::optional<int64_t>(pick(3)); }
  void check_cast(const char* what, const Model& m, const std::vector<int>& ids, bool patches,
                  std::optional<int64_t> sig, const Stats& before, const Stats& after, bool repeat);
  void check_bytes(const char* what, const at::Tensor& got, const Source& s, std::optional<c10::ScalarType> dtype);
  void check_stats(const Stats& s);
  void fail(const std::string& why);
  void note(const std::string& op) {
    recent_.push_back(op);
    if (recent_.size() > 16) recent_.pop_front();
  }
  Stats stats() { return pins::ops::stats(); }

  int index_;
  std::mt19937_64 rng_;
  at::Generator gen_;
  bool solo_;  // no other thread runs: the quiescent checks too
  int next_source_ = 0;
  int next_model_ = 0;
  int64_t ops_ = 0;
  std::vector<Model> models_;
  std::vector<int64_t> forgotten_;  // recently forgotten ids of this world
  std::vector<Source> sources_;
  at::Tensor arena_;
  int64_t arena_used_ = 0;  // bytes of arena_ handed out
  std::set<HitKey> may_hit_;
  // The last single cast, for an immediate repeat.
  struct Last {
    int64_t model = -1;
    int source = -1;
    bool patches = false, resident = false;
    std::optional<int64_t> sig;
    bool created = false;
    int64_t gone = 0;  // the model's evictions + dropped after that cast
  } last_;
  std::map<std::string, int64_t> monotonic_;
  std::deque<std::string> recent_;
  std::string failure_;
};

std::string fmt_sig(std::optional<int64_t> s) {
  return s ? std::to_string(*s) : "none";
}

void World::fail(const std::string& why) {
  if (!failure_.empty()) return;
  std::ostringstream os;
  os << "world " << index_ << " op " << ops_ << ": " << why << "\n  recent operations:";
  for (const std::string& r : recent_) os << "\n    " << r;
  failure_ = os.str();
}

at::Tensor World::fresh(at::IntArrayRef sizes, c10::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return at::randn(sizes, gen_, at::TensorOptions().dtype(dtype));
  return at::randint(0, 120, sizes, gen_, at::TensorOptions().dtype(dtype));
}

at::Tensor World::new_arena() {
  arena_used_ = 0;
  return at::zeros({1 << 20}, at::kByte);  // 1 MiB
}

Source World::make_source() {
  static const c10::ScalarType kDtypes[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kInt, at::kByte};
  Source s;
  s.id = next_source_++;
  const c10::ScalarType dtype = kDtypes[pick(6)];
  const int64_t el = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<int64_t> sizes;
  const int dims = pick(4);                                  // 0-D to 3-D
  const int64_t cap = chance(0.05) ? (1 << 19) : (1 << 14);  // elements: mostly small, sometimes 512K
  int64_t numel = 1;
  for (int d = 0; d < dims; ++d) {
    int64_t n =
        1 + pick(static_cast<int>(std::min<int64_t>(96, std::max<int64_t>(1, cap / std::max<int64_t>(numel, 1)))));
    if (chance(0.01)) n = 0;  // an empty source: bypassed.empty
    sizes.push_back(n);
    numel *= n;
  }
  const bool transpose = dims == 2 && chance(0.3);
  if (chance(0.35) && numel > 0 && numel * el <= (1 << 18)) {
    // A view into the arena, at its own bytes (aligned to the element size).
    if (!arena_.defined() || arena_used_ + numel * el + 64 > arena_.numel()) arena_ = new_arena();
    const int64_t off = (arena_used_ + el - 1) / el * el;
    arena_used_ = off + numel * el;
    at::Tensor flat = arena_.narrow(0, off, numel * el).view(dtype);
    flat.copy_(fresh({numel}, dtype));
    s.t = transpose ? flat.view({sizes[1], sizes[0]}).t() : flat.view(sizes);
    s.arena = arena_;
  } else if (chance(0.3)) {
    c10::InferenceMode guard;  // as ComfyUI loads weights: no version counter
    s.t = fresh(transpose ? std::vector<int64_t>{sizes[1], sizes[0]} : sizes, dtype);
    if (transpose) s.t = s.t.t();
    s.inference = true;
  } else {
    s.t = fresh(transpose ? std::vector<int64_t>{sizes[1], sizes[0]} : sizes, dtype);
    if (transpose) s.t = s.t.t();
  }
  s.storage = reinterpret_cast<uint64_t>(s.t.storage().unsafeGetStorageImpl());
  s.offset = static_cast<uint64_t>(s.t.storage_offset()) * el;
  int64_t last = 0;
  for (int64_t d = 0; d < s.t.dim(); ++d) last += (s.t.size(d) - 1) * s.t.stride(d);
  s.span = s.t.numel() == 0 ? 0 : static_cast<uint64_t>(last + 1) * el;
  return s;
}

// After the bytes of `s` changed: whole_storage (the version counter every view
// of a storage shares was bumped, or the whole storage was invalidated) forgets
// every source of that storage, else the sources overlapping `s`'s bytes
// (invalidate(s)); with every gathered group that holds one.
void World::forget_bytes(const Source& s, bool whole_storage) {
  std::set<int> hit;
  for (const Source& o : sources_) {
    if (o.storage != s.storage) continue;
    if (whole_storage || (o.offset < s.offset + s.span && s.offset < o.offset + o.span)) hit.insert(o.id);
  }
  for (auto it = may_hit_.begin(); it != may_hit_.end();) {
    const std::vector<int>& ids = std::get<1>(*it);
    const bool touched = std::any_of(ids.begin(), ids.end(), [&](int id) { return hit.count(id) != 0; });
    it = touched ? may_hit_.erase(it) : std::next(it);
  }
}

std::optional<c10::ScalarType> World::pick_dtype(const Source& s) {
  // Conversions between floating types only (float to int is undefined out of range).
  if (!at::isFloatingType(s.t.scalar_type()) || chance(0.5)) return std::nullopt;
  static const c10::ScalarType kTo[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble};
  return kTo[pick(4)];
}

void World::check_bytes(const char* what, const at::Tensor& got, const Source& s,
                        std::optional<c10::ScalarType> dtype) {
  const at::Tensor want = s.t.contiguous().to(dtype.value_or(s.t.scalar_type()));
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type() || !got.is_contiguous() ||
      got.device() != kCpu) {
    std::ostringstream os;
    os << what << " of source " << s.id << ": got " << got.sizes() << " " << got.scalar_type() << " contiguous "
       << got.is_contiguous() << ", want " << want.sizes() << " " << want.scalar_type();
    return fail(os.str());
  }
  if (got.numel() > 0 && got.storage().unsafeGetStorageImpl() == s.t.storage().unsafeGetStorageImpl())
    return fail(std::string(what) + " of source " + std::to_string(s.id) + " shares the source's storage");
  if (got.nbytes() != want.nbytes() ||
      (got.nbytes() > 0 && std::memcmp(got.data_ptr(), want.data_ptr(), got.nbytes()) != 0))
    return fail(std::string(what) + " of source " + std::to_string(s.id) + ": bytes differ from the source's now");
}

void World::check_cast(const char* what, const Model& m, const std::vector<int>& ids, bool patches,
                       std::optional<int64_t> sig, const Stats& before, const Stats& after, bool repeat) {
  const int64_t hits = get(after, mkey(m.id, "hits")) - get(before, mkey(m.id, "hits"));
  const int64_t misses = get(after, mkey(m.id, "misses")) - get(before, mkey(m.id, "misses"));
  const int64_t empty = get(after, mkey(m.id, "bypassed.empty")) - get(before, mkey(m.id, "bypassed.empty"));
  const int64_t busy = get(after, mkey(m.id, "bypassed.busy")) - get(before, mkey(m.id, "bypassed.busy"));
  int64_t created = 0;
  for (const char* s : kSubsets)
    created +=
        get(after, mkey(m.id, std::string(s) + ".created")) - get(before, mkey(m.id, std::string(s) + ".created"));
  // Evicted or dropped since the cast being repeated (by any thread).
  const int64_t gone_now = get(after, mkey(m.id, "evictions")) + get(after, mkey(m.id, "dropped"));
  const int64_t gone = gone_now - last_.gone;
  std::ostringstream os;
  os << what << " model " << m.id << " sources";
  for (int id : ids) os << ' ' << id;
  os << (patches ? " patches" : " weights") << " signature " << fmt_sig(sig) << ": hits +" << hits << ", misses +"
     << misses << ", bypassed.empty +" << empty << ", created +" << created;
  if (hits + misses + empty != 1) return fail(os.str() + ": not counted exactly once");
  const HitKey key{m.id, ids, patches, sig};
  if (hits == 1 && may_hit_.count(key) == 0)
    return fail(os.str() + ": a hit the reference does not allow (a stale or foreign pin served)");
  if (repeat && last_.created && hits == 0 && gone == 0 && busy == 0)
    return fail(os.str() + ": the repeat of a cast that created a pin missed, with nothing evicted or dropped");
  if (empty == 0) may_hit_.insert(key);
  last_.created = created == 1;
  // With other threads running, a pin can go between its creation and the
  // snapshot after this cast: count from before it.
  last_.gone = solo_ ? gone_now : get(before, mkey(m.id, "evictions")) + get(before, mkey(m.id, "dropped"));
}

void World::check_stats(const Stats& s) {
  auto bad = [&](const std::string& what, int64_t got, int64_t want) {
    std::ostringstream os;
    os << "stats: " << what << " is " << got << ", want " << want;
    fail(os.str());
  };
  // Totals over subsets and over models.
  int64_t pins = 0, bytes = 0, hits = 0, misses = 0, models = 0;
  std::set<int64_t> ids;
  for (const auto& e : s)
    if (e.key().rfind("model.", 0) == 0 && e.key().size() > 9 && e.key().compare(e.key().size() - 3, 3, ".id") == 0) {
      const std::string mid = e.key().substr(6, e.key().size() - 9);
      if (mid == std::to_string(e.value())) ids.insert(e.value());
    }
  models = static_cast<int64_t>(ids.size());
  if (get(s, "models") != models) bad("models", get(s, "models"), models);
  for (const char* sub : kSubsets) {
    const std::string p(sub);
    int64_t sp = 0, sb = 0, sh = 0, sm = 0;
    for (int64_t id : ids) {
      sp += get(s, mkey(id, p + ".pins"));
      sb += get(s, mkey(id, p + ".bytes"));
      sh += get(s, mkey(id, p + ".hits"));
      sm += get(s, mkey(id, p + ".misses"));
    }
    if (get(s, p + ".pins") != sp) bad(p + ".pins vs the sum over models", get(s, p + ".pins"), sp);
    if (get(s, p + ".bytes") != sb) bad(p + ".bytes vs the sum over models", get(s, p + ".bytes"), sb);
    // Counters: at least the live models' (equal while forgotten models' counts are dropped).
    if (get(s, p + ".hits") < sh) bad(p + ".hits vs the sum over models", get(s, p + ".hits"), sh);
    if (get(s, p + ".misses") < sm) bad(p + ".misses vs the sum over models", get(s, p + ".misses"), sm);
    pins += get(s, p + ".pins");
    bytes += get(s, p + ".bytes");
    hits += get(s, p + ".hits");
    misses += get(s, p + ".misses");
  }
  if (get(s, "pins") != pins) bad("pins vs the sum over subsets", get(s, "pins"), pins);
  if (get(s, "pinned_bytes") != bytes) bad("pinned_bytes vs the sum over subsets", get(s, "pinned_bytes"), bytes);
  if (get(s, "hits") != hits) bad("hits vs the sum over subsets", get(s, "hits"), hits);
  if (get(s, "misses") != misses) bad("misses vs the sum over subsets", get(s, "misses"), misses);
  int64_t tiers = 0, reasons = 0;
  for (int t = 1; t <= 5; ++t) tiers += get(s, "evictions.tier" + std::to_string(t));
  if (get(s, "evictions") != tiers) bad("evictions vs the sum over tiers", get(s, "evictions"), tiers);
  if (g_reasons.empty()) {  // the reasons the library names; read once, before any thread starts
    for (const auto& e : s)
      if (e.key().rfind("bypassed.", 0) == 0) g_reasons.push_back(e.key().substr(9));
    std::sort(g_reasons.begin(), g_reasons.end());
  }
  for (const std::string& r : g_reasons) reasons += get(s, "bypassed." + r);
  if (get(s, "bypassed") != reasons) bad("bypassed vs the sum over reasons", get(s, "bypassed"), reasons);
  // Each model: its subsets add up, and the cast and pin identities.
  for (int64_t id : ids) {
    int64_t mp = 0, mb = 0, mh = 0, mm = 0, created = 0, gone = 0, ev = 0, dr = 0;
    for (const char* sub : kSubsets) {
      const std::string p(sub);
      const int64_t sp = get(s, mkey(id, p + ".pins"));
      int64_t sev = 0;
      for (int t = 1; t <= 5; ++t) sev += get(s, mkey(id, p + ".evictions.tier" + std::to_string(t)));
      const int64_t sc = get(s, mkey(id, p + ".created")), sd = get(s, mkey(id, p + ".dropped"));
      if (sp != sc - sev - sd) bad(mkey(id, p + ".pins vs created - evictions - dropped"), sp, sc - sev - sd);
      if ((sp == 0) != (get(s, mkey(id, p + ".bytes")) == 0))
        bad(mkey(id, p + ".bytes with pins ") + std::to_string(sp), get(s, mkey(id, p + ".bytes")), -1);
      mp += sp;
      mb += get(s, mkey(id, p + ".bytes"));
      mh += get(s, mkey(id, p + ".hits"));
      mm += get(s, mkey(id, p + ".misses"));
      created += sc;
      ev += sev;
      dr += sd;
      gone += sev + sd;
    }
    if (get(s, mkey(id, "pins")) != mp) bad(mkey(id, "pins"), get(s, mkey(id, "pins")), mp);
    if (get(s, mkey(id, "bytes")) != mb) bad(mkey(id, "bytes"), get(s, mkey(id, "bytes")), mb);
    if (get(s, mkey(id, "hits")) != mh) bad(mkey(id, "hits"), get(s, mkey(id, "hits")), mh);
    if (get(s, mkey(id, "misses")) != mm) bad(mkey(id, "misses"), get(s, mkey(id, "misses")), mm);
    if (get(s, mkey(id, "evictions")) != ev) bad(mkey(id, "evictions"), get(s, mkey(id, "evictions")), ev);
    if (get(s, mkey(id, "dropped")) != dr) bad(mkey(id, "dropped"), get(s, mkey(id, "dropped")), dr);
    int64_t by = 0;
    for (const std::string& r : g_reasons) by += get(s, mkey(id, "bypassed." + r));
    if (get(s, mkey(id, "bypassed")) != by) bad(mkey(id, "bypassed"), get(s, mkey(id, "bypassed")), by);
    const int64_t not_empty = by - get(s, mkey(id, "bypassed.empty"));
    // A miss is counted before its pin is created or the cast bypassed: exact
    // once the cast returned (this world's models, or no other thread running).
    const bool settled =
        solo_ || std::any_of(models_.begin(), models_.end(), [&](const Model& m) { return m.id == id; });
    if (settled ? mm != created + not_empty : mm < created + not_empty)
      bad(mkey(id, "misses vs created + bypassed (not empty)"), mm, created + not_empty);
  }
  // This world's models: casts counted once each, names equal ids, forgotten gone.
  for (const Model& m : models_) {
    if (ids.count(m.id) == 0) {
      bad(mkey(m.id, "id (registered, missing)"), 0, m.id);
      continue;
    }
    const int64_t counted =
        get(s, mkey(m.id, "hits")) + get(s, mkey(m.id, "misses")) + get(s, mkey(m.id, "bypassed.empty"));
    if (counted != m.casts) bad(mkey(m.id, "hits + misses + bypassed.empty vs casts issued"), counted, m.casts);
    for (const char* k : {"pins", "hits", "misses", "bypassed", "weights-loaded.bytes"})
      if (get(s, "model." + m.name + "." + k) != get(s, mkey(m.id, k)))
        bad("model." + m.name + "." + k + " vs by id", get(s, "model." + m.name + "." + k), get(s, mkey(m.id, k)));
  }
  for (int64_t f : forgotten_)
    if (s.contains(mkey(f, "id")) || ids.count(f)) bad("a key of forgotten model " + std::to_string(f), 1, 0);
  // The pool.
  const int64_t committed = get(s, "committed_bytes"), allocated = get(s, "pool_allocated_bytes"),
                requested = get(s, "pool_requested_bytes"), locked = get(s, "locked_bytes");
  if (committed < allocated) bad("committed_bytes >= pool_allocated_bytes", committed, allocated);
  if (committed < allocated + get(s, "prewarmed_bytes"))  // idle, committed ahead: in no block
    bad("committed_bytes >= pool_allocated_bytes + prewarmed_bytes", committed, allocated + get(s, "prewarmed_bytes"));
  if (allocated < requested) bad("pool_allocated_bytes >= pool_requested_bytes", allocated, requested);
  if (locked > committed) bad("locked_bytes <= committed_bytes", locked, committed);
  if (committed > kCap) bad("committed_bytes <= cap", committed, kCap);
  if (get(s, "reserved_bytes") < committed)
    bad("reserved_bytes >= committed_bytes", get(s, "reserved_bytes"), committed);
  if (get(s, "pool_committed_peak_bytes") < committed)
    bad("pool_committed_peak_bytes >= committed_bytes", get(s, "pool_committed_peak_bytes"), committed);
  if (solo_ && requested != bytes) bad("pool_requested_bytes vs pinned_bytes (no thread running)", requested, bytes);
  for (const char* k : kMonotonic) {
    const int64_t v = get(s, k);
    auto [it, fresh] = monotonic_.emplace(k, v);
    if (!fresh && v < it->second) bad(std::string(k) + " went down", v, it->second);
    it->second = v;
  }
}

void World::op_register() {
  Model m;
  m.name = "w" + std::to_string(index_) + "m" + std::to_string(next_model_++);
  // Note [Prewarm]: half the models say their size, so prompts prewarm for them.
  const int64_t size = chance(0.5) ? (int64_t{1} + pick(32)) << 20 : 0;
  m.id = pins::ops::register_model(m.name, kCpu, chance(0.2), size);
  note("register_model " + m.name + " size " + std::to_string(size) + " -> " + std::to_string(m.id));
  models_.push_back(m);
}

void World::op_forget() {
  if (models_.empty()) return op_register();
  const int i = pick(static_cast<int>(models_.size()));
  const int64_t id = models_[i].id;
  note("forget_model " + std::to_string(id));
  pins::ops::forget_model(id);
  models_.erase(models_.begin() + i);
  for (auto it = may_hit_.begin(); it != may_hit_.end();)
    it = std::get<0>(*it) == id ? may_hit_.erase(it) : std::next(it);
  forgotten_.push_back(id);
  if (forgotten_.size() > 8) forgotten_.erase(forgotten_.begin());
  if (last_.model == id) last_.model = -1;
}

void World::op_cast(bool repeat) {
  if (models_.empty()) return op_register();
  if (sources_.empty()) return op_replace_source();
  int si;
  int mi;
  bool patches, resident;
  std::optional<int64_t> sig;
  const auto lm = std::find_if(models_.begin(), models_.end(), [&](const Model& m) { return m.id == last_.model; });
  if (repeat && lm != models_.end() && last_.source != -1) {
    mi = static_cast<int>(lm - models_.begin());
    si = last_.source;
    patches = last_.patches;
    resident = last_.resident;
    sig = last_.sig;
  } else {
    repeat = false;
    mi = pick(static_cast<int>(models_.size()));
    si = pick_source();
    patches = chance(0.3);
    resident = chance(0.4);
    sig = pick_signature();
  }
  Model& m = models_[mi];
  const Source& s = sources_[si];
  const std::optional<c10::ScalarType> dtype = pick_dtype(s);
  std::ostringstream os;
  os << (repeat ? "repeat " : "") << "cast_to_device source " << s.id << " model " << m.id
     << (patches ? " patches" : " weights") << " resident " << resident << " signature " << fmt_sig(sig);
  note(os.str());
  const Stats before = stats();
  const at::Tensor got =
      pins::ops::cast_to_device(s.t, kCpu, dtype, chance(0.5), m.id, patches ? "patches" : "weights", resident, sig);
  m.casts++;
  const Stats after = stats();
  check_bytes("cast_to_device", got, s, dtype);
  check_cast("cast_to_device", m, {s.id}, patches, sig, before, after, repeat);
  last_.model = m.id;
  last_.source = si;
  last_.patches = patches;
  last_.resident = resident;
  last_.sig = sig;
  check_stats(after);
}

void World::op_cast_out() {
  if (models_.empty() || sources_.empty()) return op_cast(false);
  Model& m = models_[pick(static_cast<int>(models_.size()))];
  const Source& s = sources_[pick_source()];
  const std::optional<c10::ScalarType> dtype = pick_dtype(s);
  const bool patches = chance(0.3), resident = chance(0.4);
  const std::optional<int64_t> sig = pick_signature();
  note("cast_to_device.out source " + std::to_string(s.id) + " model " + std::to_string(m.id));
  at::Tensor out = at::full(s.t.sizes(), 7, at::TensorOptions().dtype(dtype.value_or(s.t.scalar_type())));
  const Stats before = stats();
  at::Tensor& ret =
      pins::ops::cast_to_device_out(out, s.t, kCpu, dtype, false, m.id, patches ? "patches" : "weights", resident, sig);
  m.casts++;
  const Stats after = stats();
  if (!ret.is_same(out)) fail("cast_to_device.out did not return `out`");
  check_bytes("cast_to_device.out", out, s, dtype);
  check_cast("cast_to_device.out", m, {s.id}, patches, sig, before, after, false);
  last_.source = -1;
  check_stats(after);
}

void World::op_cast_many() {
  if (models_.empty() || sources_.size() < 2) return op_cast(false);
  Model& m = models_[pick(static_cast<int>(models_.size()))];
  // A group keeps its members in order; repeated groups hit, so pick from a few.
  const int n = 1 + pick(3);
  const int start = pick_source();
  std::vector<int> idx, ids;
  std::vector<at::Tensor> ts;
  for (int k = 0; k < n; ++k) {
    const int i = (start + k) % static_cast<int>(sources_.size());
    if (std::find(idx.begin(), idx.end(), i) != idx.end()) break;
    idx.push_back(i);
    ids.push_back(sources_[i].id);
    ts.push_back(sources_[i].t);
  }
  std::optional<c10::ScalarType> dtype;
  if (std::all_of(idx.begin(), idx.end(), [&](int i) { return at::isFloatingType(sources_[i].t.scalar_type()); }))
    dtype = pick_dtype(sources_[idx[0]]);
  const bool patches = chance(0.3), resident = chance(0.4);
  const std::optional<int64_t> sig = pick_signature();
  std::ostringstream os;
  os << "cast_many_to_device model " << m.id << " sources";
  for (int id : ids) os << ' ' << id;
  note(os.str());
  const Stats before = stats();
  const std::vector<at::Tensor> got = pins::ops::cast_many_to_device(ts, kCpu, dtype, chance(0.5), m.id,
                                                                     patches ? "patches" : "weights", resident, sig);
  m.casts++;
  const Stats after = stats();
  if (got.size() != idx.size()) return fail("cast_many_to_device returned " + std::to_string(got.size()) + " tensors");
  for (size_t k = 0; k < idx.size(); ++k) check_bytes("cast_many_to_device", got[k], sources_[idx[k]], dtype);
  for (size_t a = 0; a < got.size(); ++a)
    for (size_t b = a + 1; b < got.size(); ++b)
      if (got[a].numel() > 0 && got[b].numel() > 0 &&
          got[a].storage().unsafeGetStorageImpl() == got[b].storage().unsafeGetStorageImpl())
        fail("cast_many_to_device: two results share a storage");
  // A group whose every source is empty takes no bytes: bypassed.empty.
  check_cast("cast_many_to_device", m, ids, patches, sig, before, after, false);
  last_.source = -1;
  check_stats(after);
}

void World::op_plain_copy() {
  if (sources_.empty()) return op_replace_source();
  const Source& s = sources_[pick(static_cast<int>(sources_.size()))];
  note("cast_to_device model -1 source " + std::to_string(s.id));
  const int64_t before = get(stats(), "plain_copies");
  const at::Tensor got = pins::ops::cast_to_device(s.t, kCpu);
  const Stats after = stats();
  if (solo_ && get(after, "plain_copies") != before + 1) fail("plain_copies not counted once");
  check_bytes("plain copy", got, s, std::nullopt);
  check_stats(after);
}

void World::op_write_tensor() {
  if (sources_.empty()) return op_replace_source();
  Source& s = sources_[pick(static_cast<int>(sources_.size()))];
  if (s.inference || s.t.numel() == 0) return op_write_hidden();
  // Seen by the version counter every view of the storage shares.
  const bool base = s.arena.defined() && chance(0.2);
  note(std::string("write through the tensor ") + (base ? "(the arena) of " : "") + std::to_string(s.id));
  if (base) {
    s.arena.copy_(fresh({s.arena.numel()}, at::kByte));
  } else {
    s.t.copy_(fresh(s.t.sizes(), s.t.scalar_type()));
  }
  forget_bytes(s, /*whole_storage=*/true);
  check_stats(stats());
}

void World::op_write_hidden() {
  if (sources_.empty()) return op_replace_source();
  Source& s = sources_[pick(static_cast<int>(sources_.size()))];
  if (s.t.numel() == 0) return;
  const at::Tensor bytes = fresh(s.t.sizes(), s.t.scalar_type());
  if (s.inference) {
    note("write an inference tensor in place, then invalidate " + std::to_string(s.id));
    c10::InferenceMode guard;
    s.t.copy_(bytes);
  } else {
    note("write through .data, then invalidate " + std::to_string(s.id));
    const int64_t v = s.t._version();
    s.t.variable_data().copy_(bytes);
    if (s.t._version() != v) fail(".data write bumped the source's version counter");
  }
  pins::ops::invalidate(s.t);
  forget_bytes(s, /*whole_storage=*/false);
  check_stats(stats());
}

void World::op_invalidate_arena() {
  for (const Source& s : sources_)
    if (s.arena.defined()) {
      note("write the arena through .data, invalidate it (all its views) " + std::to_string(s.id));
      s.arena.variable_data().copy_(fresh({s.arena.numel()}, at::kByte));
      pins::ops::invalidate(s.arena);
      forget_bytes(s, /*whole_storage=*/true);
      check_stats(stats());
      return;
    }
}

void World::op_invalidate_model() {
  if (models_.empty()) return op_register();
  const int64_t id = models_[pick(static_cast<int>(models_.size()))].id;
  note("invalidate_model " + std::to_string(id));
  pins::ops::invalidate_model(id);
  const Stats s = stats();
  if (get(s, mkey(id, "pins")) != 0) fail("pins left after invalidate_model");
  for (auto it = may_hit_.begin(); it != may_hit_.end();)
    it = std::get<0>(*it) == id ? may_hit_.erase(it) : std::next(it);
  check_stats(s);
}

void World::op_replace_source() {
  Source s = make_source();
  note("new source " + std::to_string(s.id) + " " + c10::toString(s.t.scalar_type()) + " " + c10::str(s.t.sizes()) +
       (s.arena.defined() ? " arena view" : "") + (s.inference ? " inference" : "") +
       (s.t.is_contiguous() ? "" : " non-contiguous"));
  if (sources_.size() < 24) {
    sources_.push_back(std::move(s));
  } else {
    // The old tensor dies here: its pins hold a dead storage.
    const int i = pick(static_cast<int>(sources_.size()));
    const int old = sources_[i].id;
    for (auto it = may_hit_.begin(); it != may_hit_.end();) {
      const std::vector<int>& ids = std::get<1>(*it);
      it = std::find(ids.begin(), ids.end(), old) != ids.end() ? may_hit_.erase(it) : std::next(it);
    }
    sources_[i] = std::move(s);
  }
  last_.source = -1;
}

void World::op_boundary() {
  const int which = pick(4);
  if (which == 0 && !models_.empty()) {
    std::vector<int64_t> marks;
    for (const Model& m : models_)
      if (chance(0.6)) marks.push_back(m.id);
    note("mark_prompt (" + std::to_string(marks.size()) + " models)");
    pins::ops::mark_prompt(marks);
  } else if (which == 1 && !models_.empty()) {
    const Model& m = models_[pick(static_cast<int>(models_.size()))];
    note("set_active " + std::to_string(m.id));
    pins::ops::set_active(m.id, chance(0.7));
  } else if (which == 2) {
    note("end_node");
    pins::ops::end_node();
    if (solo_ && get(stats(), "patches.pins") != 0) fail("patches pins left after end_node");
  } else {
    note("end_prompt");
    pins::ops::end_prompt();
    const Stats s = stats();
    if (solo_ && get(s, "patches.pins") != 0) fail("patches pins left after end_prompt");
    if (solo_ && get(s, "prompt") != 0) fail("a prompt still running after end_prompt");
  }
  check_stats(stats());
}

void World::op_free() {
  const int64_t bytes = chance(0.2) ? (int64_t{1} << 40) : (int64_t{1} << pick(22));
  const bool all = chance(0.3);
  note("free_pins " + std::to_string(bytes) + (all ? " evict_active" : ""));
  const int64_t pinned = get(stats(), "pinned_bytes");
  const int64_t freed = pins::ops::free_pins(bytes, all);
  const Stats s = stats();
  if (freed < 0) fail("free_pins returned a negative count");
  if (solo_ && get(s, "pinned_bytes") != pinned - freed)
    fail("free_pins returned " + std::to_string(freed) + " but pinned_bytes went from " + std::to_string(pinned) +
         " to " + std::to_string(get(s, "pinned_bytes")));
  if (solo_ && all && bytes >= pinned && get(s, "pins") != 0) fail("pins left after freeing more than every pin");
  check_stats(s);
}

void World::op_configure() {
  static const char* const kPolicies[] = {"mru", "lru", "trace", "reuse"};
  // Mostly the defaults (budget never binding here); sometimes a headroom
  // larger than the machine's RAM, so every new pin first frees and then is
  // refused (`bypassed.refused`, evictions along the tiers).
  static const char* const kHeadroom[] = {"4G", "4G", "4G", "0", "1M", "1T"};
  std::ostringstream os;
  os << "policy:" << kPolicies[pick(4)] << ",fast_disk:" << (chance(0.2) ? "true" : "false")
     << ",headroom:" << kHeadroom[pick(6)] << ",pin_reserve:" << (chance(0.5) ? "2G" : "0")
     << ",pin_slack:" << (chance(0.5) ? "256M" : "64K") << ",relieve_slack:" << (chance(0.5) ? "512M" : "0")
     << ",content_check:" << (chance(0.5) ? "true" : "false");  // Note [Content check]: never a stale hit either way
  if (!solo_) os << ",monitor:" << (chance(0.3) ? "true,monitor_interval_ms:5" : "false");
  os << ",prewarm:" << (chance(0.8) ? "true" : "false");
  note("configure " + os.str());
  pins::ops::configure(os.str());
  check_stats(stats());
}

void World::op_forgotten_model_cast() {
  if (forgotten_.empty() || sources_.empty()) return op_cast(false);
  const int64_t id = forgotten_.back();
  note("cast_to_device with forgotten model " + std::to_string(id));
  try {
    pins::ops::cast_to_device(sources_[0].t, kCpu, std::nullopt, false, id);
    fail("a cast with forgotten model " + std::to_string(id) + " was served");
  } catch (const c10::ValueError&) {
  }
  check_stats(stats());
}

void World::step(int64_t n) {
  for (int64_t i = 0; i < n && failure_.empty(); ++i) {
    ops_++;
    const int r = pick(1000);
    if (r >= 380) last_.source = -1;  // a repeat follows its cast immediately
    const char* name;
    try {
      if (r < 300) {
        name = "cast";
        op_cast(false);
      } else if (r < 380) {
        name = "repeat cast";
        op_cast(true);
      } else if (r < 460) {
        name = "cast out=";
        op_cast_out();
      } else if (r < 550) {
        name = "cast_many";
        op_cast_many();
      } else if (r < 565) {
        name = "plain copy";
        op_plain_copy();
      } else if (r < 640) {
        name = "write through the tensor";
        op_write_tensor();
      } else if (r < 690) {
        name = "hidden write + invalidate";
        op_write_hidden();
      } else if (r < 695) {
        name = "arena invalidate";
        op_invalidate_arena();
      } else if (r < 740) {
        name = "new source";
        op_replace_source();
      } else if (r < 755) {
        name = "register_model";
        if (models_.size() < 4) op_register();
        else op_forget();
      } else if (r < 765) {
        name = "forget_model";
        op_forget();
      } else if (r < 775) {
        name = "invalidate_model";
        op_invalidate_model();
      } else if (r < 915) {
        name = "boundary";
        op_boundary();
      } else if (r < 955) {
        name = "free_pins";
        op_free();
      } else if (r < 980) {
        name = "configure";
        op_configure();
      } else {
        name = "cast with a forgotten model";
        op_forgotten_model_cast();
      }
      counts[name]++;
    } catch (const std::exception& e) {
      fail(std::string("unexpected exception: ") + e.what());
    }
  }
}

void World::clear() {
  for (const Model& m : models_) pins::ops::forget_model(m.id);
  models_.clear();
  sources_.clear();
  arena_ = at::Tensor();
  may_hit_.clear();
  last_ = Last{};
}

TEST(ModelBased, RandomOperationsAgainstAReference) {
  const int64_t total = env_int("PINS_MODEL_OPS", 100000);
  const int threads = static_cast<int>(env_int("PINS_MODEL_THREADS", 3));
  const uint64_t seed = static_cast<uint64_t>(env_int("PINS_SEED", static_cast<int64_t>(std::random_device{}() >> 1)));
  std::printf("model-based test: PINS_SEED=%llu PINS_MODEL_OPS=%lld PINS_MODEL_THREADS=%d (set them to replay)\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(total), threads);
  std::fflush(stdout);
  RecordProperty("seed", std::to_string(seed));
  const auto t0 = std::chrono::steady_clock::now();

  World main_world(0, seed, /*solo=*/true);
  std::vector<std::unique_ptr<World>> workers;
  for (int w = 1; w <= threads; ++w) workers.push_back(std::make_unique<World>(w, seed + 7919 * w, false));
  // 40 segments; every fourth a burst of the workers at once (a quarter of the ops).
  const int segments = 40;
  const int64_t per_segment = std::max<int64_t>(1, total / segments);
  int64_t done = 0;
  for (int seg = 0; seg < segments && done < total; ++seg) {
    const int64_t n = seg == segments - 1 ? total - done : std::min(per_segment, total - done);
    if (threads > 0 && seg % 4 == 3) {
      std::vector<std::thread> ts;
      for (auto& w : workers) ts.emplace_back([&w, n, threads] { w->step((n + threads - 1) / threads); });
      for (std::thread& t : ts) t.join();
      done += n;
      for (auto& w : workers) {
        ASSERT_FALSE(w->failed()) << w->failure() << "\n(PINS_SEED=" << seed << ")";
        w->clear();  // the next sequential steps see the main world's models only
      }
      // Back to a known configuration, the monitor off: the next steps are alone.
      pins::ops::configure("monitor:false,headroom:4G,fast_disk:false,policy:mru");
    } else {
      main_world.step(n);
      done += n;
      ASSERT_FALSE(main_world.failed()) << main_world.failure() << "\n(PINS_SEED=" << seed << ")";
    }
  }
  int64_t ops = main_world.ops();
  std::map<std::string, int64_t> counts = main_world.counts;
  for (auto& w : workers) {
    ops += w->ops();
    for (const auto& [k, v] : w->counts) counts[k] += v;
    w->clear();
  }
  main_world.clear();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Stats s = pins::ops::stats();
  std::printf("model-based test: %lld operations in %.1f s (seed %llu), %d threads in bursts\n",
              static_cast<long long>(ops), secs, static_cast<unsigned long long>(seed), threads);
  for (const auto& [k, v] : counts) std::printf("  %-28s %lld\n", k.c_str(), static_cast<long long>(v));
  std::printf(
      "  totals: %lld hits, %lld misses, %lld evictions, %lld dropped, bypassed %lld (refused %lld, pool %lld, "
      "empty %lld)\n",
      static_cast<long long>(get(s, "hits")), static_cast<long long>(get(s, "misses")),
      static_cast<long long>(get(s, "evictions")), static_cast<long long>(get(s, "dropped")),
      static_cast<long long>(get(s, "bypassed")), static_cast<long long>(get(s, "bypassed.refused")),
      static_cast<long long>(get(s, "bypassed.pool")), static_cast<long long>(get(s, "bypassed.empty")));
  EXPECT_GE(ops, total);
  EXPECT_EQ(get(s, "pins"), 0) << "pins left with every model forgotten";
  EXPECT_EQ(get(s, "models"), 0);
}

}  // namespace

int main(int argc, char** argv) {
  // The pool's cap is fixed when the runtime is built: before the first op.
  const std::string conf = "cap:" + std::to_string(kCap >> 20) + "M,retain_free:8M";
  setenv("PINS_CONF", conf.c_str(), 1);
  // One intra-op thread: the tensors are small, and OpenMP's idle spinning
  // would take most of the time of two cores.
  at::set_num_threads(1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
