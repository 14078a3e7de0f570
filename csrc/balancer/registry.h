// Models and their pins: what the balancer keeps and evicts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace pins {

using ModelId = int64_t;

// The four subsets of a model's pins (DESIGN.md "Concepts").
enum class Subset : int { Weights = 0, Patches = 1, WeightsLoaded = 2, PatchesLoaded = 3 };
constexpr int kSubsets = 4;
const char* to_string(Subset s);
inline bool is_streaming(Subset s) { return s == Subset::Weights || s == Subset::Patches; }
inline bool is_patch(Subset s) { return s == Subset::Patches || s == Subset::PatchesLoaded; }

// What the caller says a source is: a weight or a patch tensor.
enum class Kind { Weights, Patches };
inline Subset streaming_subset(Kind k) { return k == Kind::Weights ? Subset::Weights : Subset::Patches; }
inline Subset cache_subset(Kind k) { return k == Kind::Weights ? Subset::WeightsLoaded : Subset::PatchesLoaded; }

// The subset a new pin goes to (DESIGN.md "Choosing and creating a pin", step
// 3): the -loaded subset when the source stays on the device (`resident`), the
// configuration allows cache pins (`cache_allowed`: neither fast_disk nor the lru
// policy) and, for patches, a signature identifies the patch set; else the
// streaming subset. The balancer creates pins by it; the simulator labels
// accesses by it.
inline Subset target_subset(Kind kind, bool resident, bool has_signature, bool cache_allowed) {
  const bool cache = resident && cache_allowed && (kind == Kind::Weights || has_signature);
  return cache ? cache_subset(kind) : streaming_subset(kind);
}

// A source's identity: its storage, byte offset and size; `layout` tells apart
// non-contiguous views of the same bytes (0 for a contiguous source).
struct PinKey {
  uint64_t storage = 0;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint64_t layout = 0;
  bool operator==(const PinKey&) const = default;
};
struct PinKeyHash {
  size_t operator()(const PinKey& k) const {
    uint64_t h = k.storage * 0x9E3779B97F4A7C15ull;
    h ^= k.offset + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
    h ^= k.nbytes + 0x85EBCA77C2B2AE63ull + (h << 6) + (h >> 2);
    h ^= k.layout + 0x27D4EB2F165667C5ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// One source of a pin: its identity (key), the bytes of its storage it reaches
// from key.offset (`span`: key.nbytes for a contiguous source, more for a strided
// view, what invalidate() compares against) and its version counter when the pin
// was made (none for a source without one, such as an inference tensor). A
// gathered pin (several sources in one block) holds one per source, in order.
struct SourcePart {
  PinKey key;
  uint64_t span = 0;
  std::optional<uint64_t> version;
  bool operator==(const SourcePart&) const = default;
};

// What a look at a pin's source on a hit found (SourceGuard::current).
enum class SourceChange {
  None,     // the pin still holds the source's bytes, as far as the look can tell
  File,     // the file the source is mapped from changed on disk (Note [Changed files])
  Content,  // a sampled window of the source differs from the pin (Note [Content check])
};

// Whether a pin's source still exists and still holds what the pin holds. The
// torch layer implements it with a weak reference to the source's storage, so
// a pin never outlives (or is served for a new storage at the address of) a
// dead one, for a source in a mapped file with the file's change count (Note
// [Changed files] in csrc/files/mapped.h), and with a sample of the source's
// bytes (Note [Content check] in content_check.h). nullptr: always alive and
// current (simulator).
class SourceGuard {
 public:
  virtual ~SourceGuard() = default;
  // Cheap (no syscall): checked under the balancer's lock.
  virtual bool alive() const = 0;
  // Asked on a hit, outside the balancer's lock, while the caller holds the
  // source: may look at what backs the source (a syscall, rate-limited) and,
  // when `content`, compares the source's sampled windows with the pin's.
  // Anything but None: the pin holds bytes the source no longer has.
  virtual SourceChange current(bool /*content*/) { return SourceChange::None; }
};

enum class PinState { Filling, Live, Evicting };

// Why a cast for a registered model was served straight from its source, not
// through a pin (Note [Cast path] in ops/cast_to_device.cpp).
enum class Bypass : int {
  Empty = 0,      // the source has no bytes
  Refused = 1,    // the budget (RAM's, or the pool's cap: Note [Cap budget]) refused a new pin (DESIGN.md "Budget")
  Pool = 2,       // the host pool refused the block (the OS; a block past the whole cap, or a race: Note [Cap budget])
  Busy = 3,       // the source's pin is being filled or evicted by another thread
  Raced = 4,      // another thread pinned the same source while this one made room
  Forgotten = 5,  // the model was forgotten while its pin was being made
  Unlocking = 6,  // the pin's extent is losing its page-lock (Note [Copies from a block] in csrc/pool/pool.h)
};
constexpr int kBypassReasons = 7;
const char* to_string(Bypass b);

// Note [Pin validity]
// A pin serves a cast only while all of these match the request (else it is
// stale: dropped and made again): its source's storage (held weakly by the
// guard: a dead storage never matches), byte offset, size and layout (the key),
// the version counter where the source has one, and the caller's signature,
// absent or not (a patch set for patches, a content signature for weights). A
// gathered pin compares every part. On a hit, outside the balancer's lock, the
// guard's current() looks at what it can without the version counter: a
// mapped file's changes (Note [Changed files]) and a few windows of the
// source's bytes (Note [Content check]). Other writes that bypass the version
// counter are the caller's to report, with Balancer::invalidate or a new
// signature.
struct Pin {
  PinKey key;
  Subset subset = Subset::Weights;
  ModelId model = -1;
  size_t bytes = 0;
  void* block = nullptr;                  // pool block (null in dry runs of the simulator)
  uint64_t created = 0;                   // creation order, global
  uint64_t last_use = 0;                  // balancer clock at last hit or fill
  std::optional<int64_t> signature;       // the caller's signature (Note [Pin validity])
  std::optional<uint64_t> version;        // the source's version counter when made; none without one
  uint64_t span = 0;                      // bytes of its storage the source reaches (0: key.nbytes)
  std::vector<SourcePart> parts;          // a gathered pin: its sources in order; empty for one source
  std::unique_ptr<SourceGuard> guard;
  PinState state = PinState::Filling;
  int users = 0;                          // leases out (copies being issued)
  bool orphaned = false;                  // detached from its model; freed when users drops to 0
  uint64_t reuse_gap = 0;  // the reuse policy: its key's prompt gap (Note [Reuse policy])
  // The trace policy: its entry in Model::by_trace while listed there (Note [Trace index]).
  bool trace_indexed = false;
  uint64_t trace_cls = 0, trace_value = 0;
  size_t ring = SIZE_MAX;                 // its slot in the reclaim ring while linked (Note [Dead source reclaim])
  // Note [Shared pins]: the block maps a shared segment (adopted by the pool).
  // `share_publish`: this process fills it, and publishes it when filled.
  bool shared = false;
  bool share_publish = false;
  uint32_t share_entry = 0;
  uint64_t share_generation = 0;
};

// Per model and subset counters; levels are `pins` and `bytes`, the rest COUNT/SUM.
constexpr int kTiers = 5;
struct SubsetStats {
  int64_t pins = 0;            // level
  int64_t bytes = 0;           // level
  int64_t hits = 0;            // COUNT
  int64_t misses = 0;          // COUNT
  int64_t hit_bytes = 0;       // SUM
  int64_t miss_bytes = 0;      // SUM
  int64_t created = 0;         // COUNT pins created
  int64_t evictions[kTiers] = {};  // COUNT evictions by tier (index tier-1)
  int64_t evicted_bytes = 0;   // SUM
  int64_t dropped = 0;         // COUNT pins dropped: stale, node/prompt boundary, forget, invalidate
  int64_t invalidated = 0;     // COUNT of those, by invalidate() or invalidate_model()
  int64_t lock_drops = 0;      // COUNT page-lock drops (registration ceiling)
  int64_t inflight_skips = 0;  // COUNT eviction candidates skipped for a copy in flight or a lease
  int64_t content_mismatches = 0;  // COUNT hits whose source's sampled bytes differed: dropped, made again

  int64_t evictions_all() const {  // COUNT evictions over every tier
    int64_t n = 0;
    for (int64_t e : evictions) n += e;
    return n;
  }
  SubsetStats& operator+=(const SubsetStats& o) {  // sums every field, levels included
    pins += o.pins;
    bytes += o.bytes;
    hits += o.hits;
    misses += o.misses;
    hit_bytes += o.hit_bytes;
    miss_bytes += o.miss_bytes;
    created += o.created;
    for (int t = 0; t < kTiers; ++t) evictions[t] += o.evictions[t];
    evicted_bytes += o.evicted_bytes;
    dropped += o.dropped;
    invalidated += o.invalidated;
    lock_drops += o.lock_drops;
    inflight_skips += o.inflight_skips;
    content_mismatches += o.content_mismatches;
    return *this;
  }
};

// What a caller says about a model when registering it.
struct ModelOptions {
  bool fast_disk = false;  // its weights reload fast from disk: no new pins in its -loaded subsets
  // Note [Prewarm] (prewarm.h): the bytes of its weights, what its first prompt
  // is expected to pin; 0: unknown.
  uint64_t size = 0;
};

struct Model {
  ModelId id = -1;
  std::string name;
  std::string load_device;
  ModelOptions options;
  uint64_t load_seq = 0;        // larger: loaded more recently
  uint64_t last_use = 0;
  // Note [Idle cache pins] (pin_table.h): the clock when the last prompt the
  // model ran in started; its cache pins last used then or before went unused
  // through that prompt. None until it has run in a prompt.
  std::optional<uint64_t> idle_through;
  bool in_prompt = false;
  bool active = false;
  // Note [Spared layers on the device] (pin_table.h): the bytes of its weights
  // on its device when the application last said (Balancer::set_device_bytes),
  // and of all its weights; none until it says.
  struct OnDevice {
    uint64_t bytes = 0;
    uint64_t total = 0;
  };
  std::optional<OnDevice> on_device;
  // Note [Prewarm]: the most bytes its pins held at once while marked in the
  // prompt now (level), and in the last prompt it was marked in (-1: none yet).
  int64_t prompt_peak = 0;
  int64_t last_prompt_peak = -1;
  int64_t refusals = 0;         // COUNT pins the budget or the pool refused
  int64_t bypassed[kBypassReasons] = {};  // COUNT casts served from the source, by reason
  SubsetStats stats[kSubsets];
  std::unordered_map<PinKey, std::unique_ptr<Pin>, PinKeyHash> pins[kSubsets];
  std::map<uint64_t, Pin*> by_created[kSubsets];  // newest last
  // (last_use, created): least recently used first (Note [Eviction walk] in eviction.h).
  std::map<std::pair<uint64_t, uint64_t>, Pin*> by_use[kSubsets];
  // (max(gap, 1), last_use, bytes, created): the reuse policy's groups, kept
  // only while that policy is on (Note [Reuse policy] in reuse.h).
  using ReuseKey = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>;
  std::map<ReuseKey, Pin*> by_reuse[kSubsets];
  // (class, value, bytes, created): the trace policy's ranks, farthest next use
  // last, kept while it follows a record (Note [Trace index] in trace.h).
  using TraceIndexKey = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>;
  std::map<TraceIndexKey, Pin*> by_trace[kSubsets];
};

// The bytes of every pin of `m`, all four subsets.
inline int64_t held_bytes(const Model& m) {
  int64_t n = 0;
  for (const SubsetStats& st : m.stats) n += st.bytes;
  return n;
}

// Every registered model, by id.
using Models = std::map<ModelId, std::unique_ptr<Model>>;

// Calls f(key, span) for every source of `p`: its own key, or each part of a
// gathered pin. Empty sources (span 0) are left out: they overlap nothing.
template <typename F>
void for_each_source(const Pin& p, F&& f) {
  if (p.parts.empty()) {
    const uint64_t span = p.span != 0 ? p.span : p.key.nbytes;
    if (span != 0) f(p.key, span);
    return;
  }
  for (const SourcePart& s : p.parts)
    if (s.span != 0) f(s.key, s.span);
}

}  // namespace pins
