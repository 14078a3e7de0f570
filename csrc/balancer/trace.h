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
// followed, a pin's next use is its nearest next position, over the followed
// records, at or after their cursors. A pin that none of them uses again is
// next used by the prompt that came after the active record (the most recent
// followed one) the last time: the current prompt itself when the active record
// is the last prompt's (a rerun), the other workflow when prompts alternate; its
// next use is the rest of the active record plus its first position there. A pin
// only the active record's past used comes one prompt later still; one no record
// knows is never used again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <unordered_map>
#include <vector>

#include "csrc/balancer/registry.h"

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
  static constexpr size_t kRecords = 4;               // prompt records kept
  static constexpr size_t kLimit = size_t{1} << 20;   // accesses kept per prompt record
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  // Appends an access to the current prompt's record and moves the cursors of
  // the records it still follows.
  void record(const TraceKey& k);
  // The prompt boundary: the current prompt's record (unless it passed kLimit)
  // becomes the most recent one and every cursor goes back to the start.
  void end_prompt();
  // The rest of this prompt follows no record (a change of policy).
  void depart() { departed_ = true; }

  // Whether some record is still followed: only then is next_use() a prediction.
  bool following() const { return !departed_; }
  // Accesses until `k` is used again, kNever when no record knows it. Only
  // meaningful while following().
  uint64_t next_use(const TraceKey& k) const;

  size_t records() const { return records_.size(); }
  int64_t departures() const { return departures_; }

 private:
  struct Record {
    std::vector<TraceKey> keys;
    std::unordered_map<TraceKey, std::vector<uint32_t>, TraceKeyHash> pos;  // ascending
    size_t cursor = 0;      // the current prompt follows it up to here
    bool departed = false;  // the current prompt left it
  };

  std::vector<TraceKey> now_;                                  // this prompt's accesses
  std::unordered_map<TraceKey, uint32_t, TraceKeyHash> now_first_;  // first position in now_
  std::deque<Record> records_;  // the last prompts' records, most recent first
  bool departed_ = true;        // every record departed
  bool overflow_ = false;       // this prompt passed kLimit
  int64_t departures_ = 0;      // COUNT prompts that departed from every record
};

}  // namespace pins
