// Files mapped into memory whose bytes pins can read from the file itself
// (torch-free): the registry behind file-backed pins.
//
// Note [File-backed pins]
// pins::load_file maps a safetensors file MAP_PRIVATE and read-write, as
// applications get their weights from a loader: reads fault the file's pages
// in, and a write (ComfyUI patches weights in place) copies the page it
// touches into anonymous memory, leaving the file as it was. Each mapping is
// registered here. When a new pin's source lies inside a registered mapping,
// the pin is filled from the file (Note [File reads]) instead of through the
// mapping, unless the source's bytes may differ from the file's:
// - a page of the range is anonymous or swapped (/proc/self/pagemap): it was
//   written through the mapping. Not-present pages and pages of the page
//   cache still hold the file's bytes. If pagemap cannot be read, every page
//   counts as written.
// Then the pin is copied from memory, as for any other source, and the fall
// back is counted. A range the page cache holds whole (mincore) is read
// buffered instead of O_DIRECT, which would read the disk again, and dropped
// from the cache after (file_fills_cached): either way the weight ends up held
// once, in its pin. A file rewritten on disk under the mapping: Note [Changed
// files]. Windows maps a copy-on-write view and tells written pages otherwise:
// Note [Windows file reads] (os_files_win.cpp).
//
// Note [Changed files]
// A file rewritten in place after load_file mapped it (the same inode: written
// over, or truncated and written again) shows its new bytes through the
// mapping, in every page no write through the mapping copied; a pin made
// before holds the old ones. pins sees such a rewrite by the file's size,
// mtime and ctime (nanoseconds), as fstat of the mapped descriptor reports
// them: a FileWatch counts the times they differed from the last look,
// looking again at most every kLookInterval. A pin of a source in a mapped
// file holds the file's watch (not the mapping) and the count from when it
// was made (its SourceGuard, in ops/cast_path.cpp); a hit on it looks (outside the balancer's lock: a
// syscall, on a network filesystem a round trip) and, when the count moved,
// drops the pin and makes it again, from the file. Every other pin of that
// file is stale from then on without a look of its own (the count is an
// atomic). Not seen: a change within kLookInterval of the last look is seen
// by the first hit after it; a rewrite that keeps the size within the same
// timestamp tick as the file's previous change (the kernel's file times are
// coarse, a few milliseconds); a file replaced by rename (a new inode: the
// mapping, and its pins, keep the old file's bytes, which stay consistent).
// A write through the tensor itself is Note [Pin validity]'s, not this.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <map>
#include <string>

#include "csrc/files/read.h"
#include "csrc/share/host_share.h"

namespace pins::files {

// Note [Changed files]: a mapped file's size, mtime and ctime as last looked
// at, through a descriptor of its own, open as long as the mapping or a pin
// holds the watch (a file deleted meanwhile keeps its disk blocks until then:
// its pins go with their tensors, Note [Dead source reclaim]).
class FileWatch {
 public:
  // Takes `file`, a handle of the file, whose stamp was `stamp`.
  FileWatch(FileHandle file, const FileStamp& stamp);
  ~FileWatch();
  FileWatch(const FileWatch&) = delete;
  FileWatch& operator=(const FileWatch&) = delete;

  // How many times the file was seen changed. `look`: fstat it first, when the
  // last look is kLookInterval old or older (else no syscall).
  uint64_t changes(bool look);
  // changes(), after a look made now whenever the last one was.
  uint64_t look_now();
  static constexpr int64_t kLookInterval = 2'000'000;  // ns

 private:
  const FileHandle file_;
  std::mutex mu_;    // a leaf: one look at a time
  FileStamp stamp_;  // guarded by mu_
  std::atomic<int64_t> looked_ns_;
  std::atomic<uint64_t> changes_{0};
};

// One mapping of a whole file: unmapped and closed when the last holder goes.
class MappedFile {
 public:
  // Maps `path` (pins::ResourceError naming it when it cannot be opened,
  // stat-ed or mapped) and registers the mapping.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  char* data() const { return static_cast<char*>(base_); }
  uint64_t size() const { return size_; }
  FileHandle file() const { return file_; }
  FileHandle direct() const { return direct_; }  // kNoFile where the filesystem refuses direct reads
  // Note [Changed files].
  const std::shared_ptr<FileWatch>& watch() const { return watch_; }
  // The file as it was when mapped: its identity keys shared pins (Note [Shared pins]).
  const FileStamp& stamp() const { return stamp_; }

 private:
  // Counted in file_fill_stats().mapped_files from here to the destructor, so
  // an open that throws halfway leaves the count as it found it.
  MappedFile();
  std::string path_;
  FileHandle file_ = kNoFile;
  FileHandle direct_ = kNoFile;
  void* base_ = nullptr;
  uint64_t size_ = 0;
  FileStamp stamp_;
  std::shared_ptr<FileWatch> watch_;
};

// Where [p, p + n) lies in a registered mapping, if it lies wholly in one.
struct FileRange {
  std::shared_ptr<MappedFile> file;
  uint64_t offset = 0;  // of p in the file
};
bool find_mapped(const void* p, uint64_t n, FileRange& out);

// Whether any mapping is registered now: a test that costs an atomic load,
// before find_mapped's lookup.
bool any_mapped();

// Note [Truncated mappings]
// A read through a mapping of bytes the file no longer holds (truncated on
// disk after load_file mapped it) is a SIGBUS, not an error. Before pins reads
// a source through memory (a copy from the source itself: a plain copy, a
// cast the balancer serves from the source, a pin filled from memory), the
// source's range is checked against the file's size now: a file shorter than
// the range is a pins::ResourceError naming the file, its size and the range.
// A truncation between that check and the read still faults: the window is
// the copy itself. A pin already made holds its bytes and is served without a
// read of the source. Windows refuses to truncate a file that has a mapped
// view, so there the fault has no counterpart (Note [Windows file reads]).
void check_file_covers(const FileRange& where, uint64_t n);

// pages_unwritten(p, n) (os_files.h) tells a range written through its mapping.

// Counters of the fills from files, process-wide and never decreasing.
struct FileFillStats {
  uint64_t fills = 0;       // pins filled from their file
  uint64_t bytes = 0;       // bytes read for them
  uint64_t direct = 0;      // of the fills, those read with O_DIRECT
  uint64_t cached = 0;      // of the fills, those the page cache held whole: read from it, then dropped
  uint64_t written = 0;     // pins of a mapped source filled from memory: pages written
  uint64_t mapped_files = 0;  // mappings alive now
  uint64_t changes = 0;     // looks that found a mapped file changed on disk (Note [Changed files])
};
FileFillStats file_fill_stats();
void count_file_fill(uint64_t bytes, bool direct, bool cached = false);
void count_written_fallback();

// Fills dst (n bytes) with [p, p + n) from its file when Note [File-backed
// pins] allows it; false (nothing written, the fall back counted where it
// applies) when the range is not in a registered mapping or was written.
// `file_only`: read the file even where the range was written through its
// mapping (a shared pin holds the file's bytes: Note [Shared pins]).
bool fill_from_file(const void* p, uint64_t n, void* dst, int threads = kReadThreads, bool file_only = false);

// Note [Shared pins] (csrc/share/host_share.h): the key of [p, p + n) when a pin
// of it may be shared: it lies in a registered mapping, no page of it was
// written through the mapping, and the file has not changed since it was
// mapped (Note [Changed files]; looked at now, a syscall). False otherwise.
bool share_key_of(const void* p, uint64_t n, share::Key& out);
// Whether [p, p + n) lies in a registered mapping whose file has not changed
// since it was mapped, looked at now: a shared pin filled from the file is
// published only then.
bool unchanged_since_mapped(const void* p, uint64_t n);

}  // namespace pins::files
