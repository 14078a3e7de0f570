// The check of Note [Host pool invariants].
#include "csrc/pool/snapshot.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "csrc/base/check.h"

namespace pins {
namespace {

template <typename... Args>
[[noreturn]] void violated(const Args&... args) {
  throw std::logic_error(detail::cat("host pool invariant violated (Note [Host pool invariants]): ", args...));
}

std::string hex(uintptr_t a) { return detail::cat("0x", std::hex, a); }

// An address interval of a segment: a free range or an extent.
struct Span {
  uintptr_t addr;
  size_t size;
  const char* what;
};

void check_segments_and_extents(const PoolSnapshot& s) {
  std::map<uintptr_t, const PoolSnapshot::Segment*> segs;
  int64_t reserved = 0;
  for (const auto& g : s.segments) {
    if (!segs.emplace(g.base, &g).second) violated("segment ", hex(g.base), " is listed twice");
    reserved += static_cast<int64_t>(g.size);
  }
  if (reserved != s.stats.reserved_bytes.current)
    violated("reserved_bytes is ", s.stats.reserved_bytes.current, " but the segments sum to ", reserved);

  const auto inside = [&](uintptr_t seg, uintptr_t addr, size_t size, const char* what) {
    auto it = segs.find(seg);
    if (it == segs.end()) violated(what, " ", hex(addr), " names segment ", hex(seg), ", which does not exist");
    const auto& g = *it->second;
    if (size == 0 || addr < g.base || addr + size > g.base + g.size)
      violated(what, " ", hex(addr), " of ", size, " bytes is not inside its segment ", hex(g.base), " of ",
               g.size, " bytes");
  };

  std::map<uintptr_t, size_t> free_space;
  std::set<std::pair<size_t, uintptr_t>> by_size;
  std::vector<Span> spans;
  for (const auto& r : s.ranges) {
    inside(r.segment, r.addr, r.size, "free range");
    free_space[r.segment] += r.size;
    by_size.insert({r.size, r.addr});
    spans.push_back({r.addr, r.size, "free range"});
  }
  const std::set<std::pair<size_t, uintptr_t>> listed(s.ranges_by_size.begin(), s.ranges_by_size.end());
  if (listed != by_size || listed.size() != s.ranges_by_size.size())
    violated("ranges_by_size lists ", s.ranges_by_size.size(), " entries that do not match the ", s.ranges.size(),
             " free ranges");
  for (size_t i = 1; i < s.ranges.size(); ++i) {
    const auto& a = s.ranges[i - 1];
    const auto& b = s.ranges[i];
    if (a.segment == b.segment && a.addr + a.size == b.addr)
      violated("free ranges ", hex(a.addr), " and ", hex(b.addr), " touch but did not coalesce");
  }
  size_t used = 0;
  for (const auto& g : s.segments) {
    if (free_space[g.base] != g.free_space)
      violated("segment ", hex(g.base), " says ", g.free_space, " bytes are free, its ranges sum to ",
               free_space[g.base]);
    used += g.size - g.free_space;
  }

  int64_t committed = 0;
  int64_t locked = 0;
  int64_t prewarmed = 0;
  size_t extent_bytes = 0;
  for (const auto& e : s.extents) {
    if (e.prewarmed) {
      if (e.locked || e.unlocking || e.decommitting || e.locking || e.used != 0)
        violated("prewarmed extent ", hex(e.base), " is not idle and unlocked (locked ", e.locked, ", unlocking ",
                 e.unlocking, ", decommitting ", e.decommitting, ", locking ", e.locking, ", used ", e.used, ")");
      prewarmed += static_cast<int64_t>(e.size);
    }
    if (e.locking && (e.locked || e.unlocking || e.decommitting))
      violated("extent ", hex(e.base), " is being locked but is locked, unlocking or decommitting");
    if (e.retiring) violated("extent ", hex(e.base), " of a segment is retiring, as only an adopted block does");
    inside(e.segment, e.base, e.size, "extent");
    if (s.page != 0 && (e.base % s.page != 0 || e.size % s.page != 0))
      violated("extent ", hex(e.base), " of ", e.size, " bytes is not page-aligned (page ", s.page, ")");
    spans.push_back({e.base, e.size, "extent"});
    committed += static_cast<int64_t>(e.size);
    if (e.locked || e.unlocking) locked += static_cast<int64_t>(e.size);
    extent_bytes += e.size;
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.addr < b.addr; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i - 1].addr + spans[i - 1].size > spans[i].addr)
      violated(spans[i - 1].what, " ", hex(spans[i - 1].addr), " of ", spans[i - 1].size, " bytes overlaps ",
               spans[i].what, " ", hex(spans[i].addr));
  if (used != extent_bytes + s.committing)
    violated("the segments use ", used, " bytes, but the extents hold ", extent_bytes, " and ", s.committing,
             " are being committed");

  // Note [Adopted blocks]: outside every segment, overlapping nothing.
  std::vector<Span> outside;
  for (const auto& g : s.segments) outside.push_back({g.base, g.size, "segment"});
  int64_t adopted = 0;
  for (const auto& e : s.adopted) {
    if (e.segment != 0 || e.prewarmed || e.decommitting)
      violated("adopted block ", hex(e.base), " names segment ", hex(e.segment), " or is prewarmed (", e.prewarmed,
               ") or decommitting (", e.decommitting, ")");
    if (e.locking && (e.locked || e.unlocking || e.retiring))
      violated("adopted block ", hex(e.base), " is being locked but is locked, unlocking or retiring");
    if (e.retiring && e.unlocking) violated("adopted block ", hex(e.base), " is retiring while being unlocked");
    if (e.size == 0 || (s.page != 0 && (e.base % s.page != 0 || e.size % s.page != 0)))
      violated("adopted block ", hex(e.base), " of ", e.size, " bytes is not whole pages (page ", s.page, ")");
    outside.push_back({e.base, e.size, "adopted block"});
    adopted += static_cast<int64_t>(e.size);
    if (e.locked || e.unlocking) locked += static_cast<int64_t>(e.size);
  }
  std::sort(outside.begin(), outside.end(), [](const Span& a, const Span& b) { return a.addr < b.addr; });
  for (size_t i = 1; i < outside.size(); ++i)
    if (outside[i - 1].addr + outside[i - 1].size > outside[i].addr)
      violated(outside[i - 1].what, " ", hex(outside[i - 1].addr), " of ", outside[i - 1].size, " bytes overlaps ",
               outside[i].what, " ", hex(outside[i].addr));
  if (adopted != s.stats.adopted_bytes.current)
    violated("adopted_bytes is ", s.stats.adopted_bytes.current, " but the adopted blocks sum to ", adopted);
  if (static_cast<int64_t>(s.adopted.size()) != s.stats.adopted_blocks.current)
    violated("adopted_blocks is ", s.stats.adopted_blocks.current, " but ", s.adopted.size(), " blocks are adopted");
  if (committed != s.stats.committed_bytes.current)
    violated("committed_bytes is ", s.stats.committed_bytes.current, " but the extents sum to ", committed);
  if (locked != s.stats.locked_bytes.current)
    violated("locked_bytes is ", s.stats.locked_bytes.current, " but the locked extents and adopted blocks sum to ",
             locked);
  if (prewarmed != s.stats.prewarmed_bytes.current)
    violated("prewarmed_bytes is ", s.stats.prewarmed_bytes.current, " but the prewarmed extents sum to ", prewarmed);
}

void check_blocks(const PoolSnapshot& s) {
  std::map<uintptr_t, const PoolSnapshot::Block*> blocks;
  for (const auto& b : s.blocks)
    if (!blocks.emplace(b.addr, &b).second) violated("block ", hex(b.addr), " is listed twice");

  std::set<std::pair<size_t, uintptr_t>> want_free[2];
  std::set<std::pair<uint64_t, uintptr_t>> want_idle;
  size_t idle_bytes = 0;
  size_t chained = 0;
  size_t parked = 0;
  int64_t allocated = 0;
  int64_t requested = 0;
  int64_t live = 0;
  int64_t copies = 0;
  for (const auto& e : s.extents) {
    auto it = blocks.find(e.base);
    if (e.decommitting || e.locking) {
      if (it != blocks.end())
        violated("extent ", hex(e.base), " is being ", e.decommitting ? "decommitted" : "locked",
                 " but still has a block");
      continue;
    }
    if (it == blocks.end()) violated("extent ", hex(e.base), " has no block at its base");
    uintptr_t at = e.base;
    uintptr_t prev = 0;
    bool prev_free = false;
    size_t used = 0;
    size_t nblocks = 0;
    for (;;) {
      const PoolSnapshot::Block& b = *it->second;
      if (b.extent != e.base)
        violated("block ", hex(b.addr), " in extent ", hex(e.base), " names extent ", hex(b.extent));
      if (b.prev != prev)
        violated("block ", hex(b.addr), " has prev ", hex(b.prev), " but follows ", prev == 0 ? "nothing" : hex(prev));
      if (b.size == 0 || (s.alignment != 0 && (b.addr % s.alignment != 0 || b.size % s.alignment != 0)))
        violated("block ", hex(b.addr), " of ", b.size, " bytes is not a positive multiple of the alignment ",
                 s.alignment);
      const bool is_free = b.state == BlockState::Free;
      if (b.copies < 0) violated("block ", hex(b.addr), " has ", b.copies, " copies begun");
      if (is_free && (b.copies != 0 || b.fences != 0))
        violated("free block ", hex(b.addr), " has ", b.copies, " copies begun and ", b.fences, " fences");
      if (e.unlocking && b.copies != 0)
        violated("block ", hex(b.addr), " has ", b.copies, " copies begun in extent ", hex(e.base),
                 ", whose page-lock is being dropped");
      copies += b.copies;
      if (is_free && prev_free)
        violated("free blocks ", hex(prev), " and ", hex(b.addr), " are neighbours but did not coalesce");
      switch (b.state) {
        case BlockState::Free:
          want_free[e.locked].insert({b.size, b.addr});
          break;
        case BlockState::Allocated:
          ++used;
          ++live;
          allocated += static_cast<int64_t>(b.size);
          requested += static_cast<int64_t>(b.requested);
          if (b.requested == 0 || b.requested > b.size)
            violated("block ", hex(b.addr), " of ", b.size, " bytes was requested with ", b.requested, " bytes");
          break;
        case BlockState::Parked:
          ++used;
          ++parked;
          break;
      }
      ++nblocks;
      at = b.addr + b.size;
      if (at > e.base + e.size)
        violated("block ", hex(b.addr), " of ", b.size, " bytes runs past the end of extent ", hex(e.base), " of ",
                 e.size, " bytes");
      if (b.next == 0) break;
      if (b.next != at)
        violated("block ", hex(b.addr), " ends at ", hex(at), " but its next block is at ", hex(b.next),
                 ": the blocks do not tile extent ", hex(e.base));
      it = blocks.find(b.next);
      if (it == blocks.end()) violated("block ", hex(b.addr), " names next ", hex(b.next), ", which is not a block");
      prev = b.addr;
      prev_free = is_free;
    }
    if (at != e.base + e.size)
      violated("the blocks of extent ", hex(e.base), " of ", e.size, " bytes end at ", hex(at), ", not at its end");
    chained += nblocks;
    if (used != e.used)
      violated("extent ", hex(e.base), " counts ", e.used, " blocks in use, it has ", used);
    if (used > 1 && e.size > s.extent_min)
      violated("extent ", hex(e.base), " of ", e.size, " bytes, larger than extent_min (", s.extent_min, "), holds ",
               used, " blocks in use");
    if (used == 0) {
      if (nblocks != 1) violated("idle extent ", hex(e.base), " is cut in ", nblocks, " free blocks");
      want_idle.insert({e.idle_since, e.base});
      idle_bytes += e.size;
    }
  }
  // Note [Adopted blocks]: one block each, in no free or idle set, in no
  // level but copies.
  for (const auto& e : s.adopted) {
    auto it = blocks.find(e.base);
    if (e.locking || e.retiring) {
      if (it != blocks.end())
        violated("adopted block ", hex(e.base), " is being ", e.locking ? "locked" : "retired",
                 " but is still listed");
      continue;
    }
    if (it == blocks.end()) violated("adopted block ", hex(e.base), " is not listed as a block");
    const PoolSnapshot::Block& b = *it->second;
    if (b.extent != e.base || b.prev != 0 || b.next != 0 || b.size != e.size)
      violated("adopted block ", hex(e.base), " of ", e.size, " bytes is not one block of its own (block of ", b.size,
               " bytes naming extent ", hex(b.extent), ", prev ", hex(b.prev), ", next ", hex(b.next), ")");
    if (b.state == BlockState::Free)
      violated("adopted block ", hex(e.base), " is free: it is retired when freed, never listed free");
    if (b.requested != b.size)
      violated("adopted block ", hex(e.base), " of ", b.size, " bytes was requested with ", b.requested, " bytes");
    if (b.copies < 0) violated("block ", hex(b.addr), " has ", b.copies, " copies begun");
    if (e.unlocking && b.copies != 0)
      violated("block ", hex(b.addr), " has ", b.copies, " copies begun in adopted block ", hex(e.base),
               ", whose page-lock is being dropped");
    if (e.used != 1) violated("adopted block ", hex(e.base), " counts ", e.used, " blocks in use, it has 1");
    copies += b.copies;
    if (b.state == BlockState::Parked) ++parked;
    ++chained;
  }
  if (chained != s.blocks.size())
    violated(s.blocks.size(), " blocks are listed but the extents' chains and the adopted blocks hold ", chained);

  for (int k = 0; k < 2; ++k) {
    const std::set<std::pair<size_t, uintptr_t>> got(s.free[k].begin(), s.free[k].end());
    if (got != want_free[k] || got.size() != s.free[k].size()) {
      std::pair<size_t, uintptr_t> diff{0, 0};
      const char* how = "";
      for (const auto& f : want_free[k])
        if (!got.count(f)) { diff = f; how = "is missing free block"; break; }
      if (*how == 0)
        for (const auto& f : got)
          if (!want_free[k].count(f)) { diff = f; how = "lists"; break; }
      if (*how == 0) how = "has a duplicate entry, such as";
      violated("the ", k ? "locked" : "unlocked", " free set ", how, " ", hex(diff.second), " of ", diff.first,
               " bytes (", s.free[k].size(), " entries, ", want_free[k].size(), " free blocks)");
    }
  }
  const std::set<std::pair<uint64_t, uintptr_t>> idle(s.idle.begin(), s.idle.end());
  if (idle != want_idle || idle.size() != s.idle.size())
    violated("the idle set lists ", s.idle.size(), " extents, but ", want_idle.size(),
             " extents have no block in use (or their idle ages differ)");
  if (idle_bytes != s.idle_bytes)
    violated("idle_bytes is ", s.idle_bytes, " but the idle extents sum to ", idle_bytes);

  if (allocated != s.stats.allocated_bytes.current)
    violated("allocated_bytes is ", s.stats.allocated_bytes.current, " but the allocated blocks sum to ", allocated);
  if (requested != s.stats.requested_bytes.current)
    violated("requested_bytes is ", s.stats.requested_bytes.current, " but the allocated blocks asked for ", requested);
  if (live != s.stats.blocks.current)
    violated("blocks is ", s.stats.blocks.current, " but ", live, " blocks are allocated");
  if (copies != s.stats.copies.current)
    violated("copies is ", s.stats.copies.current, " but the blocks have ", copies, " copies begun");
  for (uintptr_t p : s.parked) {
    auto it = blocks.find(p);
    if (it == blocks.end() || it->second->state != BlockState::Parked)
      violated("the parked list holds ", hex(p), ", which is not a parked block");
  }
  if (std::set<uintptr_t>(s.parked.begin(), s.parked.end()).size() != s.parked.size())
    violated("the parked list holds a block twice");
  if (parked != s.parked.size() + s.reaping)
    violated(parked, " blocks are parked, but the parked list holds ", s.parked.size(), " and a reap ", s.reaping);
}

}  // namespace

void check_snapshot(const PoolSnapshot& s) {
  check_segments_and_extents(s);
  check_blocks(s);
}

}  // namespace pins
