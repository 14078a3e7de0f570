// The trace policy's memory: what the last prompts accessed, how far the
// current prompt follows each of them, and the next use it predicts for a pin.
//
// Note [Trace policy]
// Under the trace policy, every acquire() appends (model, kind, key) to the
// current prompt's record (up to kTraceLimit accesses: a longer prompt keeps
// none); at end_prompt() it joins the last kTraceRecords prompts' records. A
// change of policy leaves the rest of the prompt to mru. The new prompt
// follows each record in order (each next access found within a short window
// ahead of that record's cursor; a patch access that is not found, as after a
// LoRA swap, is skipped) until it departs from it. While some record is still
// followed, a pin's next use is its key's nearest position in the active
// record at or after its cursor: the active record is the most recent one still
// followed (the others only wait, followed, to take over when it departs).
// A pin the active record does not use again is next used when the prompts
// that came after the active record last time come again, in their order, and
// then the active record's workflow itself: the workflows cycle. For a rerun
// (the active record is the last prompt's) that is the current prompt itself;
// when two workflows alternate, the other one and then this one; with three,
// the two others in their order. Its next use is the rest of the active record,
// the lengths of the records before the first that uses it, and its first
// position there. Where the records show the user's workflows going on in
// streaks (streaks_go_on(), Note [First-seen models]), a record of a workflow
// that was new when it ran and that no other kept record ran (Record::once: a
// one-off so far) is left out of the cycle, as a rerun's choice leaves it out
// (Record::next_repeats, Note [Trace context]): after a a b a, b's pins are
// not predicted to come round. The cycle kept it until issue 39's sixth round:
// a's loaded layers then ranked after b's pins, were refused, and came from
// disk at a's next text change (pins-sim held-out u37-9, a a b a a: 113.1 GiB
// against mru's 87.9, now 87.9). On held-out sets 1-31, 22 -> 20 of 1,240
// scenarios read more than min(lru, mru) plus a layer a run, on sets 32-47
// (first run then) 19 -> 17 of 640, on suite seeds 1-5 10 -> 10 of 1,000
// (docs/SIMULATOR.md, "Issue 39's sixth round"). A pin only the active
// record's past used comes after all of those; one no record from the active
// one on knows is never used again, but for a rerun: there a pin only an
// older record used (the encoder of the full prompt before a seed change,
// whose output the application cached) is next used one prompt later, at its
// position in the most recent such record, as the deferred conditioning is
// (Note [Cached conditioning]): a seed change ranked the encoder it did not
// run as never used, and the text change after it read the encoder again.
// The prediction lasts while that record is kept (kRecords prompts), which
// bounds it when wrong; a check like Note [Rule checks]' would judge it only
// as the record goes, and changed no scenario's verdict in pins-sim
// (docs/SIMULATOR.md, "Issue 39's third round"). (Until
// 2026-12 only the one prompt after the active record counted, and a pin of any
// prompt before the active record's workflow came round was never used again:
// with three workflows in turn, the next workflow's pins ranked as never used.
// With Note [Trace bypass], landed together, the suite reads 0.4-1.3% less in
// total on seeds 1-6: docs/SIMULATOR.md, "Predicting a cycle, and the
// bypass".) (The prediction once took the nearest next use over every
// followed record; the active record alone reads the same on the scenario
// suite and the bundled traces, within 0.4% either way, less on one, and it
// keeps an order an index can hold: Note [Trace index].)
//
// Note [Trace bypass]
// Belady's rule has two halves: evict what is used farthest, and do not cache
// what is used later than everything it would evict. The trace policy's walk is
// the first half; the second is this. While the trace is followed, a new weight
// pin may take a weight pin only if that pin is predicted to be used after the
// new pin's own source (rank(), farther). The walk stops at the first pin that
// is not, and the new pin is refused unless what was freed before it covers the
// shortfall: its cast copies from the source, whose pages stay in the page
// cache, and the pins the prompt needs sooner stay. The oracle bypasses the same
// way. Patch pins are taken as before (Note [Miss cost]: a patch miss is a RAM
// copy), and so are the idle cache pins (Note [Idle cache pins]). A model's
// own cache pins, which a load of it otherwise never takes, it judges like any
// other (on seeds 1-5, 53 -> 49 scenarios over min(lru, mru) + a layer).
// relieve(), free() and the page-lock drops have no new pin and free as
// before. What a walk stopped by it already freed stays freed: those pins were
// predicted to be used later than the new one. With the cycle above, 63 -> 54 of the 1,000
// scenarios of suite seeds 1-5 read more than the lesser of lru and mru plus a
// layer (docs/SIMULATOR.md, "Predicting a cycle, and the bypass").
//
// Note [Cached conditioning]
// ComfyUI caches each node's output and runs again only the nodes whose inputs
// changed. A new seed (the most common next prompt: the sampler's seed widget
// randomizes by default), a LoRA on the diffusion model or a sampler setting
// changes the sampler's inputs, not the text encoder's: the next prompt of the
// same workflow runs the sampler and what follows it, and the conditioning
// comes from the cache. So when the trace predicts a rerun (the active record
// is the last prompt's), the models the current prompt ran only before its
// sampler are predicted to run in the prompt after the next, not the next:
// their keys' class 1 value grows by the record's length. The sampler is the
// loop: a key's kLoopPasses-th access in the prompt marks it (an encoder run
// for a positive and a negative prompt reads each layer twice), and the
// conditioning models are those whose last access came before that key's
// first; a conditioning model accessed again later in the prompt (a second
// encode after sampling) leaves the set. Each change of the set is a new
// generation (Note [Trace index]). A prompt that does change the text runs the
// encoder from its source, as it would had its pins gone to the next prompt's
// sampler; the rule's check (Note [Rule checks], rule_check.h) sees it run and
// stops deferring that encoder, and any encoder with no verdict of its own,
// until a prompt of the same sampler runs without it twice. The models that
// looped (a key accessed kLoopPasses times) are the record's samplers, by which
// the checks tell one workflow from another. When it landed, on suite seeds 1-5 the trace read 0.1% less in
// total and 39 -> 38 scenarios read more than min(lru, mru) plus a layer; on
// the demo trace, at the budget pins derives (Note [Derived budget]), runs 2-9
// read 10.83 -> 10.43 GiB (the seed change after the rerun 1.51 -> 1.19); on
// the full-size WAN 2.2 trace's rerun and prompt-change sequences, which run
// the encoder every prompt, 1.6% more (docs/SIMULATOR.md, "Cached conditioning").
//
// Note [Trace context]
// Which followed record is active decides what comes after it. The most recent
// one is right for a rerun and for workflows in turn, and wrong where prompts
// come in pairs (e1 e1 e2 e2: a first e1 follows both e1 records, and the most
// recent came second in its pair, so its successor was e2). Past a rerun (the
// last prompt is not followed), the active record is the most recent followed
// one whose own predecessor ran the models the current prompt's predecessor
// ran (Record::before, ::context), when there is one: a second-order
// prediction. Its check (Note [Rule checks]) judges it at the next prompt
// against the plain choice, where the two predict different models: the
// choice stops when it was wrong and the plain one right, until it is right
// twice. On the encoder-pairs trace (profiling/traces/rules) trace read 1.29x
// mru before it and the first-seen limits, 0.99x with them (docs/SIMULATOR.md,
// "Rules with a check of their own").
// A rerun chooses the same way (since issue 39's second round; until then a
// rerun always predicted itself): the second prompt of a pair (w0 w0 w1 w1)
// follows the first one's record, which predicts w0 again, while the older w0
// record whose predecessor was a w0 prompt too was followed by w1. The last
// prompt's own record comes first when its predecessor ran what it ran (plain
// reruns change nothing), and an older record is chosen only when what came
// after it ran in another kept record too (Record::next_repeats): after w0 w0
// w1 w0, a one-off w1 is not predicted again. The check judges it like any
// choice, the plain prediction being the prompt itself. On pins-sim's held-out
// sets (seeds 1-7) 17 -> 15 of 280 scenarios read more than min(lru, mru) plus
// a layer a run, on suite seeds 1-5 22 -> 19 of 1,000; the encoder-pairs trace's
// encoder_pairs sequence, runs 2 on, 29.5 -> 24.3 GiB.
// Past a switch with no such record (e1 e1 e2 e2 e1: no kept record came
// after an e2), the choice is the most recent followed record that came first
// in its workflow's streak (Record::again false), as the current prompt does:
// its successor says whether a streak of that workflow goes on. The plain
// choice, the most recent e1, came second and predicts the switch again.
// Whether a prompt continues the streak of the one before (same_workflow):
// they share a sampler and one ran a part of the other's models (a seed change
// takes the conditioning from the cache and runs a part of the full prompt's;
// encoder pairs share the sampler and differ in the encoder). The check judges
// it like the other choice. On suite seeds 1-5, 19 -> 14 of 1,000 scenarios
// read more than min(lru, mru) plus a layer (seed 6: 2 -> 0), the held-out sets
// the same (15 of 280); on the encoder-pairs trace it predicts the e1 pair's
// second prompt (4.7 -> 0 GiB) and so no longer keeps e2's pins by the wrong
// prediction (the e2 prompt after it 0 -> 5.3 GiB): 24.3 -> 25.8 GiB in all,
// against mru's 31.8 and clairvoyant's 20.8.
//
// Note [Trace marks]
// A prompt's marks (mark_prompt) name the models it runs: pins.prompt() and
// the diffusers adapter mark them all as the prompt starts; ComfyUI's
// integration marks each as it loads. The records are followed by their keys,
// so two workflows that share an encoder (WAN 2.2 14B and 5B share UMT5;
// SD3.5 and HiDream share T5-XXL) both follow until the first sampler key, and
// the active one is the most recent: the other workflow's, when the user
// switches back. It predicts its own sampler's pins in this prompt, ahead of the
// encoder's, and the bypass (Note [Trace bypass]) refuses the encoder the pins
// it needs (after w0 w0 w1 w1, the w0 prompt left UMT5 to the page cache, and
// the next w0 prompt read it again). So once the marks name a sampler of some
// followed record (a model that looped in it: Record::looped), every followed
// record whose samplers the marks do not name departs. A record with no loop
// (its models stayed on the device) names no sampler, since its samplers are
// all its models and a shared encoder would name them; it departs only when
// the marks name none of its models. Marks that name no sampler yet
// (ComfyUI's, before the sampler loads) change nothing, and once the sampler
// loads its keys depart those records anyway. Marks that name a sampler
// before the prompt's first access (every model marked as the prompt starts)
// also say which of the record's conditioning models (those that ran only
// before its loop, Note [Cached conditioning]) do not run in this prompt: a
// seed change marks its sampler and not the encoder, whose output comes from
// the application's cache. At the prompt's start the record predicted the
// encoder first, and a boundary's relieve() took the sampler's loaded layers
// instead; an unmarked conditioning model's next use is now past this prompt,
// until it is marked (f78f84a: on suite seeds 1-5, 11 -> 10 of 1,000 over,
// the held-out sets as before). The departures (90e1310) took pins-sim's
// held-out sets (seeds 1-23, marks at the prompt's start) from 34 to 24 of 920
// scenarios reading more than min(lru, mru) plus a layer a run, and the worst
// trace/mru among them from 1.28 to 1.20; suite seeds 1-5 15 -> 14 of 1,000;
// with ComfyUI's marking (--mark on-use) no count changed (docs/SIMULATOR.md,
// "Issue 39's fourth round").
//
// Note [Trace memory]
// The recorder keeps the last kRecords prompts' records (eight; four until
// issue 39's eighth round) and the current prompt's accesses: 40 bytes an
// access for its key, 4 to 8 for its position, and about a hundred for each
// key a record holds; at most kLimit accesses a record, and a prompt past the
// limit holds none (until that round it kept its 2^20 accesses' capacity, 40
// MiB, for the life of the process). bytes() counts them by the containers'
// sizes, without the allocator's own overhead; Balancer::stats() reports it
// as trace_bytes. A prompt that streams 1,000 tensors for 20 steps holds 1.2
// MB a record (TraceRecorder.BytesCountTheRecordsAndTheCurrentPrompt).
// Eight records, not four: a streak of one workflow longer than the kept
// records left no record that came first in its streak, so streaks_go_on()
// had no evidence either way and took the workflows for taking turns, and a
// new workflow that then repeated lost its loaded layers' pins to the
// streak's (pins-sim held-out u64-8: 1.59x mru); and the cycle and Note
// [Trace context] see more of the user's order (u85-6, two workflows
// interleaved). A streak longer than even eight records counts as going on
// (count_streaks(): the oldest kept record continued its workflow). On
// held-out sets no rule was chosen on (pins-sim seeds 48-100, 2,120
// scenarios; the number of records was compared on them), 57 -> 49 read
// more than min(lru, mru) plus a layer a run, and
// the worst trace/mru 1.59 -> 1.47; on seeds 1-47, 34 -> 32; suite seeds 1-5
// 10 -> 10 (docs/SIMULATOR.md, "Issue 39's eighth round").
// Every access looks its key up in each followed record, and a user who
// reruns one workflow has all of them followed. A record with the same
// accesses as a newer one follows any prompt exactly as that one does, so it
// moves with its twin (Record::twin, found as the newer one is kept) and costs
// no lookup: pins-bench balancer's hit with every record followed reads
// 0.34-0.38 us an access, against 0.39-0.54 with four records and 0.76-0.78
// with eight and no twins (the 2-core CPU VM). Records that differ (a LoRA
// swapped every prompt) still cost a lookup each.
//
// Note [Trace index]
// A prediction is next_use = rank's class and value read against the active
// record: class 0, an absolute position p at or after the cursor (next use
// p - cursor); class 1, a value v past the rest of the record (next use
// rest + v, always farther than any class 0); class 2, never. Farthest first is
// then (class, value) descending, and a pin's rank moves only when the cursor
// passes one of its key's positions, when the current prompt first uses its key
// (class 1 of a rerun), or when the active record changes (a departure, a
// boundary: generation() counts those, and every rank is then read again). So
// the balancer keeps the pins in per-subset indexes of (class, value, bytes,
// created) (Model::by_trace), re-ranks the keys record() reports as moved, and
// re-ranks every pin once per generation at its first decision; a decision
// walks the indexes like the other policies (Note [Eviction walk]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "csrc/balancer/registry.h"
#include "csrc/balancer/rule_check.h"

namespace pins {

// An access as the records keep it.
struct TraceKey {
  ModelId model = -1;
  Kind kind = Kind::Weights;
  PinKey key;
  bool operator==(const TraceKey&) const = default;
};
struct TraceKeyHash {
  size_t operator()(const TraceKey& k) const {
    return PinKeyHash{}(k.key) ^ (static_cast<size_t>(k.model) * 31 + static_cast<size_t>(k.kind));
  }
};

// Not thread-safe: the Balancer holds it under its mutex.
class TraceRecorder {
 public:
  static constexpr size_t kRecords = 8;               // prompt records kept (Note [Trace memory])
  static constexpr size_t kLimit = size_t{1} << 20;   // accesses kept per prompt record
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  static constexpr uint32_t kLoopPasses = 3;          // Note [Cached conditioning]

  // Appends an access to the current prompt's record and moves the cursors of
  // the records it still follows. When `moved` is given and generation() stays
  // the same, appends the keys whose rank() this may have changed (`k` and those
  // whose positions in the active record the cursor passed; Note [Trace index]).
  void record(const TraceKey& k, std::vector<TraceKey>* moved = nullptr);
  // The prompt boundary: the current prompt's record (unless it passed kLimit)
  // becomes the most recent one and every cursor goes back to the start.
  void end_prompt();
  // The rest of this prompt follows no record (a change of policy).
  void depart();
  // Note [Trace marks]: the current prompt marked `models`.
  void mark(const std::vector<ModelId>& models);

  // Whether some record is still followed: only then is next_use() a prediction.
  bool following() const { return !departed_; }
  // Accesses until `k` is used again, kNever when no record knows it. Only
  // meaningful while following().
  uint64_t next_use(const TraceKey& k) const;

  // Note [Trace index]: the order of next_use() as a (class, value) pair, larger
  // farther; valid within one generation(), while following().
  struct Rank {
    uint64_t cls = 0;
    uint64_t value = 0;
  };
  Rank rank(const TraceKey& k) const;
  // Counts changes of the active record: a rank read in another generation is stale.
  uint64_t generation() const { return generation_; }

  size_t records() const { return records_.size(); }
  // Note [Trace memory]: the bytes the kept records and the current prompt's
  // accesses hold, by their containers' sizes. O(records).
  size_t bytes() const;
  // Whether a kept record accessed `m` (Note [First-seen models], pin_table.h).
  bool knows_model(ModelId m) const;
  // Whether the current prompt ran `m` only before its sampler's loop (Note
  // [Cached conditioning]), and whether the rule defers it: its check (Note
  // [Rule checks]) trusts it for `m`.
  bool conditioning(ModelId m) const { return conditioning_.count(m) != 0; }
  bool defers_conditioning(ModelId m) const { return conditioning(m) && conditioning_check_.applies(m); }
  // Note [Rule checks]: the first-seen rule's check (the pin table notes its
  // predictions), the conditioning rule's.
  FirstSeenCheck& first_seen() { return first_seen_; }
  const FirstSeenCheck& first_seen() const { return first_seen_; }
  const ConditioningCheck& conditioning_check() const { return conditioning_check_; }
  const RuleCheck& context_check() const { return context_check_; }
  // The models of the last prompt's workflow (Note [First-seen models]): of
  // the kept records that share a sampler with the last prompt
  // (Record::samplers), for which `skip` is false. Empty when that workflow
  // ran once, as a detour itself (Record::detour).
  // Returns those models and the records' samplers.
  template <typename Skip>
  std::pair<std::unordered_set<ModelId>, std::unordered_set<ModelId>> last_workflow_models(Skip skip) const {
    std::unordered_set<ModelId> out, samplers;
    if (records_.empty()) return {};
    const Record& last = records_.front();
    int runs = 0;
    for (const Record& r : records_) {
      if (&r != &last && !meets(r.samplers, last.samplers)) continue;
      runs++;
      for (ModelId m : r.models)
        if (!skip(m)) out.insert(m);
      samplers.insert(r.samplers.begin(), r.samplers.end());
    }
    if (runs < 2 && last.detour) return {};
    return {std::move(out), std::move(samplers)};
  }
  // A model gone from the balancer: its checks' state goes too.
  void forget(ModelId m) {
    first_seen_.forget(m);
    conditioning_check_.forget(m);
  }
  int64_t departures() const { return departures_; }
  // Note [First-seen models]: whether more of the kept records that came first
  // in their workflow's streak (Record::again false) were followed by the same
  // workflow than by another: the user's workflows go on past their first
  // prompt. A prompt that marked the models of the last record's workflow
  // and accessed nothing (they stayed on the device: a seed change on a large
  // GPU) leaves no record, and counts as that workflow going on
  // (Record::went_on).
  bool streaks_go_on() const { return streaks_go_on_; }

 private:
  struct Record {
    std::vector<TraceKey> keys;
    std::unordered_map<TraceKey, std::vector<uint32_t>, TraceKeyHash> pos;  // ascending
    size_t cursor = 0;      // the current prompt follows it up to here
    bool departed = false;  // the current prompt left it
    std::unordered_set<ModelId> models;  // every model of `keys`
    // The models that looped: a key of theirs accessed kLoopPasses times (the
    // samplers, Note [Cached conditioning]); all of `models` when none did.
    std::unordered_set<ModelId> samplers;
    bool looped = false;  // `samplers` are the models that looped
    std::unordered_set<ModelId> conditioning;  // the models that ran only before its loop (Note [Cached conditioning])
    std::unordered_set<ModelId> before;  // the models of the prompt before it (Note [Trace context])
    bool context = false;  // `before` is what the last prompt ran
    // The prompt after it ran what another kept record ran (Note [Trace context]).
    bool next_repeats = false;
    // It ran a model no earlier kept record knew, after some record: a
    // workflow new then (Note [First-seen models]).
    bool detour = false;
    // A detour whose workflow no other kept record ran (same_workflow): a
    // one-off so far, which the cycle leaves out where streaks go on (Note
    // [Trace policy]).
    bool once = false;
    bool again = false;      // the prompt before it ran its workflow (same_workflow)
    bool went_on = false;    // a prompt after it marked its samplers and accessed nothing
    bool with_last = false;  // the last prompt ran its workflow (same_workflow)
    size_t bytes = 0;        // what its containers hold (Note [Trace memory])
    // Note [Trace memory]: how many records newer the record with the same
    // accesses is, which this one moves with (0: none).
    size_t twin = 0;
  };
  // Note [Trace context]: b continues a's workflow, or a b's.
  static bool same_workflow(const Record& a, const Record& b) {
    const auto within = [](const std::unordered_set<ModelId>& x, const std::unordered_set<ModelId>& y) {
      for (ModelId m : x)
        if (y.count(m) == 0) return false;
      return true;
    };
    return meets(a.samplers, b.samplers) && (within(a.models, b.models) || within(b.models, a.models));
  }
  static bool meets(const std::unordered_set<ModelId>& a, const std::unordered_set<ModelId>& b) {
    for (ModelId m : a)
      if (b.count(m) != 0) return true;
    return false;
  }

  // A key's first position in now_ and its accesses so far.
  struct Seen {
    uint32_t first = 0;
    uint32_t count = 0;
  };
  std::vector<TraceKey> now_;                                  // this prompt's accesses
  std::unordered_map<TraceKey, Seen, TraceKeyHash> now_first_;  // each key of now_
  // Note [Cached conditioning]: whether the loop was found, and the models
  // that ran only before it.
  bool looped_ = false;
  std::unordered_set<ModelId> conditioning_;
  FirstSeenCheck first_seen_;             // Note [Rule checks]
  ConditioningCheck conditioning_check_;  // Note [Rule checks]
  // Note [Trace context]: the check of the choice, and what the last prompt's
  // choice and the plain one predicted the next prompt to run (empty: no choice).
  RuleCheck context_check_;
  std::unordered_set<ModelId> context_said_, plain_said_;
  std::unordered_set<ModelId> marked_;  // Note [Trace marks]: the current prompt's
  // Note [Trace marks]: the marks named a followed record's sampler before the
  // prompt's first access.
  bool marked_first_ = false;
  std::deque<Record> records_;  // the last prompts' records, most recent first
  bool departed_ = true;        // every record departed
  bool overflow_ = false;       // this prompt passed kLimit
  int64_t departures_ = 0;      // COUNT prompts that departed from every record
  uint64_t generation_ = 0;     // changes of the active record (Note [Trace index])
  bool streaks_go_on_ = false;  // streaks_go_on()
  void count_streaks();         // sets streaks_go_on_

  // The active record's index in records_ (the first one still followed, or
  // Note [Trace context]'s choice); records_.size() when none is.
  size_t active() const;
  // The first record still followed (records_.size(): none), and the one Note
  // [Trace context] would choose past it (itself when none).
  size_t first_followed() const;
  size_t context_choice(size_t first) const;
  // The record whose cursor record `i` follows with: its newest twin, or itself.
  size_t leader(size_t i) const { return i - records_[i].twin; }
  // After records departed: a new generation when the active record changed
  // (`was_active` before), and the prompt departed when none is `following`.
  void settle(size_t was_active, bool following);
  // Note [Cached conditioning]: the current prompt's access `k`, at `seen`.
  void find_conditioning(const TraceKey& k, const Seen& seen);
  // Forgets the current prompt's accesses (`release`: and their memory).
  void clear_now(bool release);
};

// The access a pin serves, as the records keep it.
TraceKey trace_key(const Pin& p);
// Note [Trace index]: p's entry in Model::by_trace, from the rank it holds;
// p ranked under `trace` (which must be following), its entry returned, and p
// marked as listed (the caller lists it).
Model::TraceIndexKey trace_index_key(const Pin& p);
Model::TraceIndexKey rank_pin(Pin& p, const TraceRecorder& trace);
// p into its model's by_trace at its rank under `trace`, and out of it.
void trace_index(Model& m, Pin* p, const TraceRecorder& trace);
void trace_unindex(Model& m, Pin* p);

}  // namespace pins
