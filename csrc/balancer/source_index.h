// Which pins hold bytes of which storage: what invalidate() looks up.
//
// Note [Source index]
// invalidate(storage, offset, span) must find every pin (of any model and
// subset, gathered pins included) whose source bytes overlap a byte range of
// one storage, without walking every pin: ComfyUI invalidates each weight it
// writes, and a model loaded from one mmap'd file has all its weights in one
// storage. The index lists each linked pin under every storage its sources lie
// in, ordered by byte offset, with the largest span seen in that storage. A
// lookup starts at offset `begin - max_span` (no source starting earlier can
// reach `begin`) and stops at `end`, so it reads only the sources near the range.
// max_span only grows while the storage has pins: a bound, never a miss. The
// balancer adds a pin when it links it and removes it when it unlinks it, under
// its lock (Note [Balancer locking]); orphans are not listed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "csrc/balancer/registry.h"

namespace pins {

class SourceIndex {
 public:
  // Lists `p` under each of its sources (for_each_source in registry.h).
  void add(Pin* p);
  // Unlists `p`; a pin that is not listed is left alone.
  void remove(Pin* p);
  // Every listed pin with a source in `storage` whose bytes [offset, offset +
  // span) overlap [begin, end), each once, in offset order.
  std::vector<Pin*> overlapping(uint64_t storage, uint64_t begin, uint64_t end) const;
  // Storages with at least one listed pin, and entries (sources) listed.
  size_t storages() const { return by_storage_.size(); }
  size_t entries() const;

 private:
  struct Entry {
    uint64_t span;
    Pin* pin;
  };
  struct Storage {
    std::multimap<uint64_t, Entry> by_offset;
    uint64_t max_span = 0;
  };
  std::unordered_map<uint64_t, Storage> by_storage_;
};

}  // namespace pins
