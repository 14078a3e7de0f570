// The system's side of csrc/files: open files, reads at an offset, the read
// buffers and the mappings. One implementation per system:
// os_files_linux.cpp (descriptors, pread, O_DIRECT, mmap) and os_files_win.cpp
// (handles, ReadFile, FILE_FLAG_NO_BUFFERING, file mappings; Note [Windows
// file reads]). Paths are UTF-8 on both. Errors are pins::ResourceError naming
// the path and the system's reason, unless a function says otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pins::files {

// An open file: a descriptor on Linux, a HANDLE on Windows, held as an integer
// so that what sits above is the same on both; kNoFile for none.
using FileHandle = intptr_t;
constexpr FileHandle kNoFile = -1;

// What Note [Changed files] compares: the file's size, and the times of its
// last write and of its last change of any kind (Linux's ctime, Windows'
// ChangeTime), in nanoseconds.
struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  // The file's identity (Note [Shared pins], csrc/share/host_share.h): the
  // device and inode on Linux; 0 on Windows, which does not share.
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool operator==(const FileStamp&) const = default;
};

// `path` opened for reading, a regular file: anything else (a FIFO, a
// directory, a device, a socket) is a pins::ValueError naming the path and what
// it is, raised before anything could block on it (a FIFO's open waits for a
// writer: the path is checked first and opened non-blocking, then checked
// again on the open file, whose stamp is left in `stamp`). A path with a NUL
// byte is a pins::ValueError (the system would open the file its prefix names);
// one that cannot be opened, a pins::ResourceError naming it and why.
FileHandle open_regular(const std::string& path, FileStamp& stamp);

// The same open file for reads that skip the system's cache (Note [File
// reads]), or kNoFile where the filesystem refuses it. Such reads take offsets,
// sizes and memory addresses that are multiples of kDirectAlign only.
FileHandle open_direct(FileHandle file);

// A second handle of the same open file, closed on its own.
FileHandle duplicate(FileHandle file, const std::string& path);

void close_file(FileHandle file);

// The file's stamp now; false (with the system's reason in `why`, when given)
// where the system cannot say.
bool stamp_of(FileHandle file, FileStamp& stamp, std::string* why = nullptr);

// Reads [offset, offset + n) into dst: all of it, unless the file ends first;
// returns the bytes read. A read error names the path and the offset.
uint64_t read_at(FileHandle file, char* dst, uint64_t n, uint64_t offset, const std::string& path);

// Note [File reads]: lets the system drop [offset, offset + n) of the file from
// its cache, where it caches what plain reads read (Linux); does nothing on
// Windows.
void drop_cached(FileHandle file, uint64_t offset, uint64_t n);

// A read buffer of `n` bytes (a multiple of 2 MiB), for the bounce buffers of
// Note [File reads]: aligned for direct reads; on Linux on a 2 MiB boundary,
// on transparent huge pages where the kernel allows them. Its pages are not
// faulted in. A pins::ResourceError naming `path` when there is no memory.
char* map_buffer(uint64_t n, const std::string& path);
void unmap_buffer(char* buffer, uint64_t n);

// Note [File-backed pins]: the whole file (`size` > 0 bytes) mapped private and
// writable: a write copies the page it touches, the file never changes.
void* map_file(FileHandle file, uint64_t size, const std::string& path);
void unmap_file(void* base, uint64_t size);

// Note [File-backed pins]: true when no page of [p, p + n), which lies in a
// map_file() mapping, was written through it (Linux: none anonymous or
// swapped in /proc/self/pagemap; Windows: none turned from copy-on-write into
// a private page).
bool pages_unwritten(const void* p, uint64_t n);

// Note [File-backed pins]: true when every page of [p, p + n), which lies in a
// map_file() mapping, is in the system's page cache now (Linux: mincore);
// always false on Windows, whose reads skip the cache anyway.
bool pages_cached(const void* p, uint64_t n);

// A range of memory: `n` bytes from `p`.
struct MemoryRange {
  const void* p = nullptr;
  uint64_t n = 0;
};

// Note [Content check] (csrc/balancer/content_check.h): for each range,
// whether every page it lies in is private anonymous memory in RAM now, so
// that reading it reads neither a file nor swap (Linux: in /proc/self/pagemap,
// present and neither a file's page nor shared; Windows: in a committed
// private region, in the working set and not shared). False for every range
// where the system cannot tell; an empty range is false. One open of pagemap
// for all of them.
std::vector<bool> pages_in_anonymous_ram(const std::vector<MemoryRange>& ranges);

}  // namespace pins::files
