#include "csrc/files/read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "csrc/base/check.h"

namespace pins::files {
namespace {

// pread of exactly n bytes unless the file ends first; returns the bytes read.
uint64_t pread_full(int fd, char* dst, uint64_t n, uint64_t off, const std::string& path) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw ResourceError(detail::cat(path, ": read at offset ", off + done, " failed (", std::strerror(errno), ")"));
    if (r == 0) break;
    done += static_cast<uint64_t>(r);
  }
  return done;
}

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
// A buffer on 2 MiB huge pages, where transparent huge pages are allowed: an
// O_DIRECT request holds at most the device's max_segments segments, and
// 4 KiB pages that are not physically adjacent are a segment each (Note
// [File reads]).
constexpr uint64_t kHugePage = 2ull << 20;
static_assert(kBounceBytes % kHugePage == 0);
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
  // kBounceBytes on a huge-page boundary, cut out of a mapping one huge page longer.
  void* m = ::mmap(nullptr, kBounceBytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    throw ResourceError(
        detail::cat(path, ": no memory for a ", kBounceBytes, "-byte read buffer (", std::strerror(errno), ")"));
  const uintptr_t at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t b = (at + kHugePage - 1) & ~(kHugePage - 1);
  if (b > at) ::munmap(m, b - at);
  ::munmap(reinterpret_cast<void*>(b + kBounceBytes), at + kHugePage - b);  // never empty: b < at + kHugePage
  char* buf = reinterpret_cast<char*>(b);
  ::madvise(buf, kBounceBytes, MADV_HUGEPAGE);  // refused where THP is off: 4 KiB pages then
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
  ::munmap(b, kBounceBytes);
}

// One chunk [lo, hi) of the range starting at `offset`, into its place in dst
// (Note [File reads]): buffered; or O_DIRECT of the chunk's aligned part
// straight into dst when dst is congruent to the file offset, else into
// `bounce` and copied out. Returns kWhole, or where the file ended.
uint64_t read_chunk(const ReadResult& how, int fd, int direct_fd, const std::string& path, uint64_t offset, char* dst,
                    uint64_t lo, uint64_t hi, char* bounce) {
  if (!how.direct) {
    const uint64_t got = pread_full(fd, dst + (lo - offset), hi - lo, lo, path);
    return got == hi - lo ? kWhole : lo + got;
  }
  if (how.congruent) {
    const auto buffered = [&](uint64_t a, uint64_t b) {
      if (a >= b) return kWhole;
      const uint64_t got = pread_full(fd, dst + (a - offset), b - a, a, path);
      return got == b - a ? kWhole : a + got;
    };
    const uint64_t alo = (lo + kDirectAlign - 1) & ~(kDirectAlign - 1);
    const uint64_t ahi = hi & ~(kDirectAlign - 1);
    if (alo >= ahi) return buffered(lo, hi);
    if (const uint64_t e = buffered(lo, alo); e != kWhole) return e;
    const uint64_t got = pread_full(direct_fd, dst + (alo - offset), ahi - alo, alo, path);
    if (got != ahi - alo) return alo + got;
    return buffered(ahi, hi);
  }
  const uint64_t alo = lo & ~(kDirectAlign - 1);
  const uint64_t ahi = (hi + kDirectAlign - 1) & ~(kDirectAlign - 1);
  const uint64_t got = pread_full(direct_fd, bounce, ahi - alo, alo, path);
  if (alo + got < hi) return alo + got;
  copy_out(dst + (lo - offset), bounce + (lo - alo), hi - lo, how.streamed);
  return kWhole;
}

}  // namespace

namespace {

// What a file that is not a regular one is, for the error refusing it.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

int open_regular(const std::string& path, struct stat& st) {
  PINS_CHECK_VALUE(path.find('\0') == std::string::npos, "path has a NUL byte at ", path.find('\0'),
                   " (the system would open '", path.c_str(), "')");
  if (::stat(path.c_str(), &st) == 0)
    PINS_CHECK_VALUE(S_ISREG(st.st_mode), path, ": not a regular file (", kind_of(st.st_mode), ")");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw ResourceError(detail::cat(path, ": cannot open (", std::strerror(errno), ")"));
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw ResourceError(detail::cat(path, ": cannot stat (", std::strerror(err), ")"));
  }
  if (!S_ISREG(st.st_mode)) {  // replaced by something else between the two looks
    ::close(fd);
    throw ValueError(detail::cat(path, ": not a regular file (", kind_of(st.st_mode), ")"));
  }
  // Reads of a regular file never block on O_NONBLOCK's account; cleared all the same.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int open_direct(int fd) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  return ::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
}

ReadResult read_range(int fd, int direct_fd, const std::string& path, uint64_t offset, void* dst, uint64_t n,
                      int threads) {
  ReadResult how;
  how.direct = direct_fd >= 0;
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
        const uint64_t e = read_chunk(how, fd, direct_fd, path, offset, out, lo, hi, buf);
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
    struct stat st {};
    uint64_t at = ended.load();
    if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < at) at = static_cast<uint64_t>(st.st_size);
    throw ResourceError(detail::cat(path, ": the file ends at ", at, ", short of the range read (", n,
                                    " bytes from offset ", offset, ")"));
  }
  // Note [File reads]: buffered reads leave what they read cached; give it back.
  if (!how.direct || how.congruent) ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
  return how;
}

}  // namespace pins::files
