#include "csrc/files/mapped.h"

#include <algorithm>

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

std::atomic<uint64_t> g_fills{0}, g_bytes{0}, g_direct{0}, g_cached{0}, g_written{0}, g_mapped{0}, g_changes{0};

}  // namespace

MappedFile::MappedFile() { g_mapped.fetch_add(1, std::memory_order_relaxed); }

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  std::shared_ptr<MappedFile> f(new MappedFile);
  f->path_ = path;
  FileStamp stamp;
  f->file_ = open_regular(path, stamp);
  f->size_ = stamp.size;
  f->stamp_ = stamp;
  f->watch_ = std::make_shared<FileWatch>(duplicate(f->file_, path), stamp);
  if (f->size_ > 0) f->base_ = map_file(f->file_, f->size_, path);
  f->direct_ = open_direct(f->file_);
  if (f->base_ != nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    r.by_base[reinterpret_cast<uintptr_t>(f->base_)] = f;
  }
  return f;
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) {
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> g(r.mu);
      r.by_base.erase(reinterpret_cast<uintptr_t>(base_));
    }
    unmap_file(base_, size_);
  }
  if (direct_ != kNoFile) close_file(direct_);
  if (file_ != kNoFile) close_file(file_);
  g_mapped.fetch_sub(1, std::memory_order_relaxed);
}

FileWatch::FileWatch(FileHandle file, const FileStamp& stamp)
    : file_(file), stamp_(stamp), looked_ns_(monotonic_ns()) {}

FileWatch::~FileWatch() { close_file(file_); }

uint64_t FileWatch::changes(bool look) {
  if (look) {
    const int64_t now = monotonic_ns();
    if (now - looked_ns_.load(std::memory_order_relaxed) >= kLookInterval) look_now();
  }
  return changes_.load(std::memory_order_acquire);
}

uint64_t FileWatch::look_now() {
  std::lock_guard<std::mutex> g(mu_);
  FileStamp seen;
  // A failed look (the file is open here: it does not fail) changes nothing.
  if (stamp_of(file_, seen) && !(seen == stamp_)) {
    stamp_ = seen;
    changes_.fetch_add(1, std::memory_order_release);
    g_changes.fetch_add(1, std::memory_order_relaxed);
  }
  looked_ns_.store(monotonic_ns(), std::memory_order_relaxed);
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
  FileStamp now;
  std::string why;
  if (!stamp_of(where.file->file(), now, &why))
    throw ResourceError(detail::cat(where.file->path(), ": cannot stat (", why, ")"));
  const uint64_t size = now.size;
  if (size >= where.offset && size - where.offset >= n) return;
  throw ResourceError(detail::cat(where.file->path(), ": the file is ", size, " bytes now, ", where.file->size(),
                                  " when it was loaded; a tensor of it reads bytes [", where.offset, ", ",
                                  where.offset + n, "), which it no longer holds (truncated after load_file)"));
}

FileFillStats file_fill_stats() {
  FileFillStats s;
  s.fills = g_fills.load(std::memory_order_relaxed);
  s.bytes = g_bytes.load(std::memory_order_relaxed);
  s.direct = g_direct.load(std::memory_order_relaxed);
  s.cached = g_cached.load(std::memory_order_relaxed);
  s.written = g_written.load(std::memory_order_relaxed);
  s.mapped_files = g_mapped.load(std::memory_order_relaxed);
  s.changes = g_changes.load(std::memory_order_relaxed);
  return s;
}

void count_file_fill(uint64_t bytes, bool direct, bool cached) {
  g_fills.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
  if (direct) g_direct.fetch_add(1, std::memory_order_relaxed);
  if (cached) g_cached.fetch_add(1, std::memory_order_relaxed);
}

void count_written_fallback() { g_written.fetch_add(1, std::memory_order_relaxed); }

bool share_key_of(const void* p, uint64_t n, share::Key& out) {
  if (n == 0 || !any_mapped()) return false;
  FileRange where;
  if (!find_mapped(p, n, where)) return false;
  // Note [Changed files] before a join: a segment keyed by the stamp of the
  // mapping holds the bytes the file had then, so it serves this source only
  // while the file has not changed since it was mapped (looked at now).
  if (where.file->watch()->look_now() != 0 || !pages_unwritten(p, n)) return false;
  const FileStamp& st = where.file->stamp();
  out = share::Key{st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns, where.offset, n};
  return true;
}

bool unchanged_since_mapped(const void* p, uint64_t n) {
  FileRange where;
  return find_mapped(p, n, where) && where.file->watch()->look_now() == 0;
}

bool fill_from_file(const void* p, uint64_t n, void* dst, int threads, bool file_only) {
  FileRange where;
  if (!find_mapped(p, n, where)) return false;
  if (!file_only && !pages_unwritten(p, n)) {
    count_written_fallback();
    return false;
  }
  const MappedFile& f = *where.file;
  // Note [File-backed pins]: a range the page cache holds whole is read from
  // it (buffered, then dropped from the cache), not from the disk again.
  const bool cached = pages_cached(p, n);
  const ReadResult how = read_range(f.file(), cached ? kNoFile : f.direct(), f.path(), where.offset, dst, n, threads);
  count_file_fill(n, how.direct, cached);
  return true;
}

}  // namespace pins::files
