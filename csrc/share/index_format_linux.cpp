// Note [Shared pins] (host_share.h): the index file's format, and the checks
// that nothing read from it is used before it passed.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "csrc/share/index_linux.h"

namespace pins::share {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

uint64_t entry_check(const Entry& e) { return hash_bytes(&e, offsetof(Entry, check), 0x656e7431); }

}  // namespace

uint64_t hash_bytes(const void* p, size_t n, uint64_t salt) {
  uint64_t h = salt;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = 0;
    std::memcpy(&v, b + i, std::min<size_t>(8, n - i));
    h = mix(h, v);
  }
  return h;
}

uint64_t header_check(const Header& h) { return hash_bytes(&h, offsetof(Header, check), 0x68647231); }

void seal(Entry& e) { e.check = entry_check(e); }

bool all_zero(const Entry& e) {
  const auto* b = reinterpret_cast<const unsigned char*>(&e);
  for (size_t i = 0; i < sizeof e; ++i)
    if (b[i] != 0) return false;
  return true;
}

bool entry_valid(const Entry& e) {
  if (e.state == kEmpty) return all_zero(e);
  if (e.check != entry_check(e)) return false;
  if (e.state == kFree) return true;
  if (e.state != kWriting && e.state != kReady) return false;
  return e.writer < kSlots && e.key.length > 0 && e.key.length <= e.key.size &&
         e.key.offset <= e.key.size - e.key.length;
}

std::string segment_name(uint32_t idx, uint64_t gen) {
  return "seg-" + std::to_string(idx) + "-" + std::to_string(gen);
}

std::string errno_text(int err) { return std::strerror(err); }

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
uint64_t round_page(uint64_t n) { return (n + page_size() - 1) & ~(uint64_t{page_size()} - 1); }

uint64_t key_hash(const Key& k) { return hash_bytes(&k, sizeof k, 0x6b657931); }

void HostShare::Impl::init_index() {
  std::memset(base, 0, kIndexBytes);
  Header& h = header();
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.slots = kSlots;
  h.entries = kEntries;
  h.entry_bytes = sizeof(Entry);
  h.check = header_check(h);
  // Generations go on from where a rebuilt index's may have been: the clock
  // keeps new names clear of any left behind.
  h.next_generation = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  sweep_files();
}

bool HostShare::Impl::header_ok() {
  const Header& h = header();
  return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.version == kVersion && h.slots == kSlots &&
         h.entries == kEntries && h.entry_bytes == sizeof(Entry) && h.check == header_check(h);
}

}  // namespace pins::share
