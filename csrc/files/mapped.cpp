#include "csrc/files/mapped.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "csrc/base/check.h"
#include "csrc/base/clock.h"
#include "csrc/files/read.h"

namespace pins::files {
namespace {

// The registry: every live mapping by its start address. Weak: a mapping's
// lifetime is its holders' (the tensors' storages), and it leaves the
// registry in its destructor.
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, std::weak_ptr<MappedFile>> by_base;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: storages may die at exit
  return *r;
}

std::atomic<uint64_t> g_fills{0}, g_bytes{0}, g_direct{0}, g_written{0}, g_mapped{0}, g_changes{0};

constexpr uint64_t kPage = 4096;

int64_t ns(const struct timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; }

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  std::shared_ptr<MappedFile> f(new MappedFile);
  f->path_ = path;
  struct stat st {};
  f->fd_ = open_regular(path, st);
  f->size_ = static_cast<uint64_t>(st.st_size);
  const int watched = ::fcntl(f->fd_, F_DUPFD_CLOEXEC, 0);
  if (watched < 0) throw ResourceError(detail::cat(path, ": cannot open (", std::strerror(errno), ")"));
  f->watch_ = std::make_shared<FileWatch>(watched, f->size_, ns(st.st_mtim), ns(st.st_ctim));
  if (f->size_ > 0) {
    // Read-write and private: writes through the tensors stay in this process
    // (copy-on-write), the file is never changed. MAP_NORESERVE: a private
    // writable mapping is otherwise charged in full against the memory the
    // kernel may commit, and a model larger than RAM could not be mapped at
    // all; pages are charged as they are written instead.
    void* base = ::mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, f->fd_, 0);
    if (base == MAP_FAILED) throw ResourceError(detail::cat(path, ": cannot map (", std::strerror(errno), ")"));
    f->base_ = base;
  }
  f->direct_fd_ = open_direct(f->fd_);
  if (f->base_ != nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    r.by_base[reinterpret_cast<uintptr_t>(f->base_)] = f;
  }
  g_mapped.fetch_add(1, std::memory_order_relaxed);
  return f;
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) {
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> g(r.mu);
      r.by_base.erase(reinterpret_cast<uintptr_t>(base_));
    }
    ::munmap(base_, size_);
  }
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
  g_mapped.fetch_sub(1, std::memory_order_relaxed);
}

FileWatch::FileWatch(int fd, uint64_t size, int64_t mtime_ns, int64_t ctime_ns)
    : fd_(fd), stamp_{size, mtime_ns, ctime_ns}, looked_ns_(monotonic_ns()) {}

FileWatch::~FileWatch() { ::close(fd_); }

uint64_t FileWatch::changes(bool look) {
  if (look) {
    const int64_t now = monotonic_ns();
    if (now - looked_ns_.load(std::memory_order_relaxed) >= kLookInterval) {
      std::lock_guard<std::mutex> g(mu_);
      struct stat st {};
      // A failed fstat (the descriptor is ours: it does not fail) changes nothing.
      if (::fstat(fd_, &st) == 0) {
        const Stamp seen{static_cast<uint64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim)};
        if (!(seen == stamp_)) {
          stamp_ = seen;
          changes_.fetch_add(1, std::memory_order_release);
          g_changes.fetch_add(1, std::memory_order_relaxed);
        }
      }
      looked_ns_.store(now, std::memory_order_relaxed);
    }
  }
  return changes_.load(std::memory_order_acquire);
}

bool find_mapped(const void* p, uint64_t n, FileRange& out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.by_base.upper_bound(a);
  if (it == r.by_base.begin()) return false;
  --it;
  std::shared_ptr<MappedFile> f = it->second.lock();
  if (!f) return false;
  const uint64_t off = a - it->first;
  if (off > f->size() || n > f->size() - off) return false;
  out.file = std::move(f);
  out.offset = off;
  return true;
}

bool any_mapped() { return g_mapped.load(std::memory_order_relaxed) != 0; }

void check_file_covers(const FileRange& where, uint64_t n) {
  struct stat st {};
  if (::fstat(where.file->fd(), &st) != 0)
    throw ResourceError(detail::cat(where.file->path(), ": cannot stat (", std::strerror(errno), ")"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size >= where.offset && size - where.offset >= n) return;
  throw ResourceError(detail::cat(where.file->path(), ": the file is ", size, " bytes now, ", where.file->size(),
                                  " when it was loaded; a tensor of it reads bytes [", where.offset, ", ",
                                  where.offset + n, "), which it no longer holds (truncated after load_file)"));
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

FileFillStats file_fill_stats() {
  FileFillStats s;
  s.fills = g_fills.load(std::memory_order_relaxed);
  s.bytes = g_bytes.load(std::memory_order_relaxed);
  s.direct = g_direct.load(std::memory_order_relaxed);
  s.written = g_written.load(std::memory_order_relaxed);
  s.mapped_files = g_mapped.load(std::memory_order_relaxed);
  s.changes = g_changes.load(std::memory_order_relaxed);
  return s;
}

void count_file_fill(uint64_t bytes, bool direct) {
  g_fills.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
  if (direct) g_direct.fetch_add(1, std::memory_order_relaxed);
}

void count_written_fallback() { g_written.fetch_add(1, std::memory_order_relaxed); }

bool fill_from_file(const void* p, uint64_t n, void* dst, int threads) {
  FileRange where;
  if (!find_mapped(p, n, where)) return false;
  if (!pages_unwritten(p, n)) {
    count_written_fallback();
    return false;
  }
  const MappedFile& f = *where.file;
  const ReadResult how = read_range(f.fd(), f.direct_fd(), f.path(), where.offset, dst, n, threads);
  count_file_fill(n, how.direct);
  return true;
}

}  // namespace pins::files
