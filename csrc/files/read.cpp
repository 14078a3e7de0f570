#include "csrc/files/read.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "csrc/base/check.h"

namespace pins::files {
namespace {

#if defined(__x86_64__)
constexpr bool kCanStream = true;
#else
constexpr bool kCanStream = false;
#endif

// A chunk's part out of its bounce buffer; `stream`: with non-temporal
// stores (Note [File reads]).
void copy_out(char* dst, const char* src, uint64_t n, bool stream) {
#if defined(__x86_64__)
  if (!stream) return static_cast<void>(std::memcpy(dst, src, n));
  const uint64_t head = std::min<uint64_t>(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const uint64_t body = n & ~uint64_t{63};
  for (uint64_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();  // the streamed stores ordered before whatever follows (the join, the caller's use)
  std::memcpy(dst + body, src + body, n - body);
#else
  (void)stream;
  std::memcpy(dst, src, n);
#endif
}

// What read_chunk returns when the file held all of the chunk.
constexpr uint64_t kWhole = UINT64_MAX;

// Note [File reads]: the bounce buffers, kept for the next read (committed
// and faulted in once: a fresh buffer per read costs page faults, and under
// memory pressure reclaim, on the hot path). At most kReadThreads are kept
// idle, kBounceBytes each: a chunk's aligned part never leaves the
// kReadChunk-aligned stretch of the file the chunk lies in.
static_assert(kReadChunk % kDirectAlign == 0);
constexpr uint64_t kBounceBytes = kReadChunk;
static_assert(kBounceBytes % (2ull << 20) == 0);  // map_buffer's sizes: whole 2 MiB pages
struct BouncePool {
  std::mutex mu;
  std::vector<char*> idle;
};
BouncePool& bounce_pool() {
  static BouncePool* p = new BouncePool;  // never destroyed: a read may run at exit
  return *p;
}
char* take_bounce(const std::string& path) {
  BouncePool& p = bounce_pool();
  {
    std::lock_guard<std::mutex> g(p.mu);
    if (!p.idle.empty()) {
      char* b = p.idle.back();
      p.idle.pop_back();
      return b;
    }
  }
  char* buf = map_buffer(kBounceBytes, path);  // on huge pages where the system allows
  std::memset(buf, 0, kBounceBytes);            // faulted in here, not by the device's first read
  return buf;
}
void give_bounce(char* b) {
  if (b == nullptr) return;
  BouncePool& p = bounce_pool();
  {
    std::lock_guard<std::mutex> g(p.mu);
    if (p.idle.size() < static_cast<size_t>(kReadThreads)) {
      p.idle.push_back(b);
      return;
    }
  }
  unmap_buffer(b, kBounceBytes);
}

// One chunk [lo, hi) of the range starting at `offset`, into its place in dst
// (Note [File reads]): buffered; or O_DIRECT of the chunk's aligned part
// straight into dst when dst is congruent to the file offset, else into
// `bounce` and copied out. Returns kWhole, or where the file ended.
uint64_t read_chunk(const ReadResult& how, FileHandle file, FileHandle direct, const std::string& path, uint64_t offset,
                    char* dst, uint64_t lo, uint64_t hi, char* bounce) {
  if (!how.direct) {
    const uint64_t got = read_at(file, dst + (lo - offset), hi - lo, lo, path);
    return got == hi - lo ? kWhole : lo + got;
  }
  if (how.congruent) {
    const auto buffered = [&](uint64_t a, uint64_t b) {
      if (a >= b) return kWhole;
      const uint64_t got = read_at(file, dst + (a - offset), b - a, a, path);
      return got == b - a ? kWhole : a + got;
    };
    const uint64_t alo = (lo + kDirectAlign - 1) & ~(kDirectAlign - 1);
    const uint64_t ahi = hi & ~(kDirectAlign - 1);
    if (alo >= ahi) return buffered(lo, hi);
    if (const uint64_t e = buffered(lo, alo); e != kWhole) return e;
    const uint64_t got = read_at(direct, dst + (alo - offset), ahi - alo, alo, path);
    if (got != ahi - alo) return alo + got;
    return buffered(ahi, hi);
  }
  const uint64_t alo = lo & ~(kDirectAlign - 1);
  const uint64_t ahi = (hi + kDirectAlign - 1) & ~(kDirectAlign - 1);
  const uint64_t got = read_at(direct, bounce, ahi - alo, alo, path);
  if (alo + got < hi) return alo + got;
  copy_out(dst + (lo - offset), bounce + (lo - alo), hi - lo, how.streamed);
  return kWhole;
}

}  // namespace

ReadResult read_range(FileHandle file, FileHandle direct, const std::string& path, uint64_t offset, void* dst,
                      uint64_t n, int threads) {
  ReadResult how;
  how.direct = direct != kNoFile;
  how.congruent = (reinterpret_cast<uintptr_t>(dst) - offset) % kDirectAlign == 0;
  if (n == 0) return how;
  if (offset > UINT64_MAX - n) throw ValueError(detail::cat(path, ": range at ", offset, " of ", n, " bytes overflows"));
  char* out = static_cast<char*>(dst);
  const uint64_t end = offset + n;
  // Chunks on kReadChunk boundaries of the file, so every O_DIRECT request but
  // the first and the last is whole aligned chunks.
  const uint64_t first = offset / kReadChunk, last = (end - 1) / kReadChunk;
  const uint64_t chunks = last - first + 1;
  // Buffered reads on one thread: the kernel's read-ahead keeps requests in
  // flight already, and readers at several offsets defeat it (Note [File reads]).
  const int most = how.direct ? std::max(threads, 1) : 1;
  const bool bounce = how.direct && !how.congruent;
  how.streamed = bounce && kCanStream && n >= kReadChunk;
  how.threads = static_cast<int>(std::clamp<uint64_t>(chunks, 1, static_cast<uint64_t>(most)));

  std::atomic<uint64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  // The least offset at which a thread found the file ended. Threads past the
  // end see nothing at their chunk's start, maybe before the one whose chunk
  // holds the end gets there: none of them reports what it saw.
  std::atomic<uint64_t> ended{kWhole};
  const auto work = [&] {
    char* buf = nullptr;
    try {
      if (bounce) buf = take_bounce(path);
      for (uint64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
        const uint64_t lo = std::max(offset, (first + c) * kReadChunk);
        const uint64_t hi = std::min(end, (first + c + 1) * kReadChunk);
        const uint64_t e = read_chunk(how, file, direct, path, offset, out, lo, hi, buf);
        if (e != kWhole) {
          next.store(chunks);  // the others stop at their next chunk
          for (uint64_t seen = ended.load(); e < seen && !ended.compare_exchange_weak(seen, e);) {
          }
          break;
        }
      }
    } catch (...) {
      next.store(chunks);
      std::lock_guard<std::mutex> g(error_mu);
      if (!error) error = std::current_exception();
    }
    give_bounce(buf);
  };
  if (how.threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(how.threads - 1));
    for (int i = 1; i < how.threads; ++i) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
  if (ended.load() != kWhole) {
    // The file's size names its end even where it ends before the range
    // starts (every thread then saw nothing at its first byte).
    FileStamp stamp;
    uint64_t at = ended.load();
    if (stamp_of(file, stamp) && stamp.size < at) at = stamp.size;
    throw ResourceError(detail::cat(path, ": the file ends at ", at, ", short of the range read (", n,
                                    " bytes from offset ", offset, ")"));
  }
  // Note [File reads]: buffered reads leave what they read cached; give it back.
  if (!how.direct || how.congruent) drop_cached(file, offset, n);
  return how;
}

}  // namespace pins::files
