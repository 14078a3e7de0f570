// The system's side of csrc/files on Linux: descriptors, pread, O_DIRECT
// through /proc/self/fd, mmap, /proc/self/pagemap (the Windows one is
// os_files_win.cpp).
#include "csrc/files/os_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "csrc/base/check.h"

namespace pins::files {
namespace {

int fd_of(FileHandle file) { return static_cast<int>(file); }

int64_t ns(const struct timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; }

FileStamp stamp_from(const struct stat& st) {
  return FileStamp{static_cast<uint64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim), static_cast<uint64_t>(st.st_dev),
                   static_cast<uint64_t>(st.st_ino)};
}

// What a file that is not a regular one is, for the error refusing it.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

constexpr uint64_t kPage = 4096;

}  // namespace

FileHandle open_regular(const std::string& path, FileStamp& stamp) {
  PINS_CHECK_VALUE(path.find('\0') == std::string::npos, "path has a NUL byte at ", path.find('\0'),
                   " (the system would open '", path.c_str(), "')");
  struct stat st {};
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
  stamp = stamp_from(st);
  return fd;
}

FileHandle open_direct(FileHandle file) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd_of(file));
  return ::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
}

FileHandle duplicate(FileHandle file, const std::string& path) {
  const int fd = ::fcntl(fd_of(file), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw ResourceError(detail::cat(path, ": cannot open (", std::strerror(errno), ")"));
  return fd;
}

void close_file(FileHandle file) { ::close(fd_of(file)); }

bool stamp_of(FileHandle file, FileStamp& stamp, std::string* why) {
  struct stat st {};
  if (::fstat(fd_of(file), &st) != 0) {
    if (why != nullptr) *why = std::strerror(errno);
    return false;
  }
  stamp = stamp_from(st);
  return true;
}

uint64_t read_at(FileHandle file, char* dst, uint64_t n, uint64_t offset, const std::string& path) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_of(file), dst + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw ResourceError(
          detail::cat(path, ": read at offset ", offset + done, " failed (", std::strerror(errno), ")"));
    if (r == 0) break;
    done += static_cast<uint64_t>(r);
  }
  return done;
}

void drop_cached(FileHandle file, uint64_t offset, uint64_t n) {
  ::posix_fadvise(fd_of(file), static_cast<off_t>(offset), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
}

// On 2 MiB transparent huge pages where the kernel allows them: an O_DIRECT
// request holds at most the device's max_segments segments, and 4 KiB pages
// that are not physically adjacent are a segment each (Note [File reads]).
char* map_buffer(uint64_t n, const std::string& path) {
  constexpr uint64_t kHugePage = 2ull << 20;
  // n bytes on a huge-page boundary, cut out of a mapping one huge page longer.
  void* m = ::mmap(nullptr, n + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    throw ResourceError(detail::cat(path, ": no memory for a ", n, "-byte read buffer (", std::strerror(errno), ")"));
  const uintptr_t at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t b = (at + kHugePage - 1) & ~(kHugePage - 1);
  if (b > at) ::munmap(m, b - at);
  ::munmap(reinterpret_cast<void*>(b + n), at + kHugePage - b);  // never empty: b < at + kHugePage
  char* buf = reinterpret_cast<char*>(b);
  ::madvise(buf, n, MADV_HUGEPAGE);  // refused where THP is off: 4 KiB pages then
  return buf;
}

void unmap_buffer(char* buffer, uint64_t n) { ::munmap(buffer, n); }

void* map_file(FileHandle file, uint64_t size, const std::string& path) {
  // Read-write and private: writes through the tensors stay in this process
  // (copy-on-write), the file is never changed. MAP_NORESERVE: a private
  // writable mapping is otherwise charged in full against the memory the
  // kernel may commit, and a model larger than RAM could not be mapped at
  // all; pages are charged as they are written instead.
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd_of(file), 0);
  if (base == MAP_FAILED) throw ResourceError(detail::cat(path, ": cannot map (", std::strerror(errno), ")"));
  return base;
}

void unmap_file(void* base, uint64_t size) { ::munmap(base, size); }

bool pages_cached(const void* p, uint64_t n) {
  if (n == 0) return true;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / kPage * kPage;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  unsigned char vec[4096];
  for (uintptr_t at = begin; at < end;) {
    const uint64_t pages = std::min<uint64_t>(sizeof vec, (end - at + kPage - 1) / kPage);
    if (::mincore(reinterpret_cast<void*>(at), pages * kPage, vec) != 0) return false;
    for (uint64_t i = 0; i < pages; ++i)
      if (!(vec[i] & 1)) return false;
    at += pages * kPage;
  }
  return true;
}

bool pages_unwritten(const void* p, uint64_t n) {
  if (n == 0) return true;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / kPage;
  const uint64_t last = (reinterpret_cast<uintptr_t>(p) + n - 1) / kPage;
  uint64_t entries[512];
  bool clean = true;
  for (uint64_t page = first; clean && page <= last;) {
    const uint64_t count = std::min<uint64_t>(512, last - page + 1);
    const ssize_t r = ::pread(fd, entries, count * 8, static_cast<off_t>(page * 8));
    if (r != static_cast<ssize_t>(count * 8)) {
      clean = false;
      break;
    }
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t e = entries[i];
      const bool present = (e >> 63) & 1, swapped = (e >> 62) & 1, file_page = (e >> 61) & 1;
      if (swapped || (present && !file_page)) {
        clean = false;
        break;
      }
    }
    page += count;
  }
  ::close(fd);
  return clean;
}

namespace {

// Note [Content check]: this process's /proc/self/pagemap, opened once (an
// open costs more than the rest of a small pin's miss) and again in a child
// of fork(), whose inherited descriptor reads the parent's pages: the
// descriptor and the pid that opened it, in one atomic, so no lock is held
// (none to inherit held across fork()). -1 where it cannot be opened.
int pagemap() {
  static std::atomic<uint64_t> cached{0};  // pid << 32 | (fd + 1); 0: none yet
  const uint64_t pid = static_cast<uint32_t>(::getpid());
  uint64_t seen = cached.load(std::memory_order_acquire);
  if (seen != 0 && seen >> 32 == pid) return static_cast<int>(seen & 0xffffffffu) - 1;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const uint64_t mine = pid << 32 | static_cast<uint64_t>(fd + 1);
  while (!cached.compare_exchange_weak(seen, mine, std::memory_order_acq_rel)) {
    if (seen != 0 && seen >> 32 == pid) {  // another thread of this process opened it first
      ::close(fd);
      return static_cast<int>(seen & 0xffffffffu) - 1;
    }
  }
  // An inherited descriptor: no thread of this process had it from here.
  if (seen != 0) ::close(static_cast<int>(seen & 0xffffffffu) - 1);
  return fd;
}

}  // namespace

std::vector<bool> pages_in_anonymous_ram(const std::vector<MemoryRange>& ranges) {
  std::vector<bool> out(ranges.size(), false);
  if (ranges.empty()) return out;
  const int fd = pagemap();
  if (fd < 0) return out;
  uint64_t entries[64];
  uint64_t held = 0, held_count = 0;  // entries[] holds the pages [held, held + held_count)
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].n == 0) continue;
    const uint64_t first = reinterpret_cast<uintptr_t>(ranges[r].p) / kPage;
    const uint64_t last = (reinterpret_cast<uintptr_t>(ranges[r].p) + ranges[r].n - 1) / kPage;
    bool anonymous = true;
    for (uint64_t page = first; anonymous && page <= last; ++page) {
      if (page < held || page >= held + held_count) {  // windows in order share the pages read last
        const uint64_t count = std::min<uint64_t>(64, last - page + 1);
        const ssize_t got = ::pread(fd, entries, count * 8, static_cast<off_t>(page * 8));
        held = page;
        held_count = got == static_cast<ssize_t>(count * 8) ? count : 0;
        if (held_count == 0) {
          anonymous = false;
          break;
        }
      }
      const uint64_t e = entries[page - held];
      const bool present = (e >> 63) & 1, file_or_shared = (e >> 61) & 1;
      anonymous = present && !file_or_shared;  // a swapped page (bit 62) is not present
    }
    out[r] = anonymous;
  }
  return out;
}

}  // namespace pins::files
