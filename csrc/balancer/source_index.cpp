#include "csrc/balancer/source_index.h"

#include <algorithm>
#include <unordered_set>

namespace pins {

void SourceIndex::add(Pin* p) {
  for_each_source(*p, [&](const PinKey& key, uint64_t span) {
    Storage& s = by_storage_[key.storage];
    s.by_offset.emplace(key.offset, Entry{span, p});
    s.max_span = std::max(s.max_span, span);
  });
}

void SourceIndex::remove(Pin* p) {
  for_each_source(*p, [&](const PinKey& key, uint64_t) {
    auto it = by_storage_.find(key.storage);
    if (it == by_storage_.end()) return;
    auto [first, last] = it->second.by_offset.equal_range(key.offset);
    for (auto e = first; e != last; ++e)
      if (e->second.pin == p) {
        it->second.by_offset.erase(e);
        break;
      }
    if (it->second.by_offset.empty()) by_storage_.erase(it);
  });
}

std::vector<Pin*> SourceIndex::overlapping(uint64_t storage, uint64_t begin, uint64_t end) const {
  std::vector<Pin*> out;
  if (begin >= end) return out;
  auto it = by_storage_.find(storage);
  if (it == by_storage_.end()) return out;
  const Storage& s = it->second;
  // Note [Source index]: no source that starts before begin - max_span reaches begin.
  const uint64_t from = begin > s.max_span ? begin - s.max_span : 0;
  std::unordered_set<Pin*> seen;
  for (auto e = s.by_offset.lower_bound(from); e != s.by_offset.end() && e->first < end; ++e)
    if (e->first + e->second.span > begin && seen.insert(e->second.pin).second) out.push_back(e->second.pin);
  return out;
}

size_t SourceIndex::entries() const {
  size_t n = 0;
  for (const auto& [storage, s] : by_storage_) n += s.by_offset.size();
  return n;
}

}  // namespace pins
