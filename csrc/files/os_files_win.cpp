// The system's side of csrc/files on Windows (the Linux one is
// os_files_linux.cpp).
//
// Note [Windows file reads]
// Note [File reads] on Windows:
// - Files are opened with FILE_FLAG_OVERLAPPED and read with ReadFile at the
//   offset an OVERLAPPED names, waiting on an event of the read's own: on a
//   handle opened without it the system runs one read of the file object at a
//   time, which would leave the threads of a read_range() taking turns.
// - The direct handle is ReOpenFile of the plain one with
//   FILE_FLAG_NO_BUFFERING, Linux's O_DIRECT: offsets, sizes and addresses
//   must be multiples of the volume's sector size, which kDirectAlign (4 KiB)
//   is for 512-byte and 4 KiB sectors alike. Reopening the handle, not the
//   path, reads the file that was opened even when it was renamed or replaced
//   since, as /proc/self/fd does on Linux.
// - drop_cached does nothing: Windows has no call that drops a range of one
//   file from its cache. What the buffered reads (a range's unaligned head and
//   tail, and files on volumes that refuse NO_BUFFERING) leave there is
//   standby memory, which GlobalMemoryStatusEx counts as available (Note
//   [Windows memory readings]).
// - The bounce buffers are plain VirtualAlloc memory (64 KiB-aligned): large
//   pages need SeLockMemoryPrivilege, which users do not have by default.
// - map_file is a copy-on-write view (PAGE_WRITECOPY, FILE_MAP_COPY). Windows
//   has no MAP_NORESERVE: it charges the whole view to the commit limit when it
//   maps it, so a file larger than RAM and the paging files cannot be mapped.
// - A page written through the view becomes a private copy, where Linux reads
//   /proc/self/pagemap to tell. Windows turns its protection from
//   PAGE_WRITECOPY into PAGE_READWRITE, which VirtualQuery reports wherever
//   the page is (in RAM or paged out), and while it is in the working set
//   QueryWorkingSetEx shows it no longer shared with the file's section.
//   pages_unwritten asks both: wine 8 reports only the second.
// - A file with a mapped view cannot be truncated (the system refuses with
//   ERROR_USER_MAPPED_FILE), so Note [Truncated mappings]'s SIGBUS has no
//   Windows counterpart; the check before a read through the mapping still
//   runs, and passes.
// Paths are UTF-8, converted to UTF-16 for the wide calls.
#include "csrc/files/os_files.h"

#include <windows.h>
#include <psapi.h>

#include <algorithm>

#include "csrc/base/check.h"
#include "csrc/base/win32.h"

namespace pins::files {
namespace {

HANDLE handle_of(FileHandle file) { return reinterpret_cast<HANDLE>(file); }
FileHandle file_of(HANDLE h) { return reinterpret_cast<FileHandle>(h); }

std::string last_error() { return win32::error_text(GetLastError()); }

// Windows' times count 100 ns since 1601; Note [Changed files] compares
// nanoseconds, here since 1970 so they fit in 64 bits.
int64_t ns(const LARGE_INTEGER& t) {
  constexpr int64_t k1601To1970 = 116444736000000000;  // in 100 ns
  return (t.QuadPart - k1601To1970) * 100;
}

bool read_stamp(HANDLE h, FileStamp& stamp) {
  FILE_BASIC_INFO basic{};
  FILE_STANDARD_INFO standard{};
  if (!GetFileInformationByHandleEx(h, FileBasicInfo, &basic, sizeof basic) ||
      !GetFileInformationByHandleEx(h, FileStandardInfo, &standard, sizeof standard))
    return false;
  stamp = FileStamp{static_cast<uint64_t>(standard.EndOfFile.QuadPart), ns(basic.LastWriteTime), ns(basic.ChangeTime)};
  return true;
}

// What an open file that is not a regular one is, for the error refusing it.
const char* kind_of(DWORD file_type) {
  switch (file_type) {
    case FILE_TYPE_PIPE: return "a pipe";
    case FILE_TYPE_CHAR: return "a character device";
    default: return "not a regular file";
  }
}

// Refuses a directory by its attributes: opening one fails (it needs
// FILE_FLAG_BACKUP_SEMANTICS) with a reason that does not say why.
void refuse_directory(const std::wstring& wide, const std::string& path) {
  WIN32_FILE_ATTRIBUTE_DATA attributes;
  if (GetFileAttributesExW(wide.c_str(), GetFileExInfoStandard, &attributes))
    PINS_CHECK_VALUE(!(attributes.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY), path,
                     ": not a regular file (a directory)");
}

[[noreturn]] void read_failed(const std::string& path, uint64_t offset) {
  throw ResourceError(detail::cat(path, ": read at offset ", offset, " failed (", last_error(), ")"));
}

// One ReadFile of at most a DWORD's worth at `offset`, waited for; the bytes
// read, 0 at the end of the file.
uint64_t read_once(HANDLE h, HANDLE event, char* dst, DWORD n, uint64_t offset, const std::string& path) {
  OVERLAPPED ov{};
  ov.Offset = static_cast<DWORD>(offset);
  ov.OffsetHigh = static_cast<DWORD>(offset >> 32);
  ov.hEvent = event;
  if (!ReadFile(h, dst, n, nullptr, &ov)) {
    const DWORD err = GetLastError();
    if (err == ERROR_HANDLE_EOF) return 0;  // at or past the end
    if (err != ERROR_IO_PENDING) read_failed(path, offset);
  }
  // Done, or under way: the count is the OVERLAPPED's once the read is done.
  DWORD got = 0;
  if (GetOverlappedResult(h, &ov, &got, TRUE)) return got;
  if (GetLastError() == ERROR_HANDLE_EOF) return 0;
  read_failed(path, offset);
}

// Note [Windows file reads]: no page of [p, p + n) turned from copy-on-write
// into read-write.
bool protections_unwritten(const void* p, uint64_t n) {
  const char* at = static_cast<const char*>(p);
  const char* end = at + n;
  while (at < end) {
    MEMORY_BASIC_INFORMATION region{};
    if (VirtualQuery(at, &region, sizeof region) == 0) return false;
    if (region.State != MEM_COMMIT || !(region.Protect & (PAGE_WRITECOPY | PAGE_EXECUTE_WRITECOPY))) return false;
    at = static_cast<const char*>(region.BaseAddress) + region.RegionSize;
  }
  return true;
}

// Note [Windows file reads]: no page of [p, p + n) in the working set and
// unshared. Asked 512 pages at a time.
bool working_set_unwritten(const void* p, uint64_t n) {
  constexpr uint64_t kPage = 4096;
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / kPage;
  const uint64_t last = (reinterpret_cast<uintptr_t>(p) + n - 1) / kPage;
  PSAPI_WORKING_SET_EX_INFORMATION pages[512];
  for (uint64_t page = first; page <= last;) {
    const uint64_t count = std::min<uint64_t>(512, last - page + 1);
    for (uint64_t i = 0; i < count; ++i) pages[i].VirtualAddress = reinterpret_cast<void*>((page + i) * kPage);
    if (!K32QueryWorkingSetEx(GetCurrentProcess(), pages, static_cast<DWORD>(count * sizeof pages[0]))) return false;
    for (uint64_t i = 0; i < count; ++i)
      if (pages[i].VirtualAttributes.Valid && !pages[i].VirtualAttributes.Shared) return false;
    page += count;
  }
  return true;
}

}  // namespace

FileHandle open_regular(const std::string& path, FileStamp& stamp) {
  PINS_CHECK_VALUE(path.find('\0') == std::string::npos, "path has a NUL byte at ", path.find('\0'),
                   " (the system would open '", path.c_str(), "')");
  const std::wstring wide = win32::widen(path);
  refuse_directory(wide, path);
  // Shared for writes and deletes too, as a descriptor on Linux is: whoever
  // rewrites or removes the file meanwhile is not refused (Note [Changed files]).
  const HANDLE h = CreateFileW(wide.c_str(), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                               nullptr, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL | FILE_FLAG_OVERLAPPED, nullptr);
  if (h == INVALID_HANDLE_VALUE) throw ResourceError(detail::cat(path, ": cannot open (", last_error(), ")"));
  const DWORD type = GetFileType(h);
  if (type != FILE_TYPE_DISK) {
    CloseHandle(h);
    throw ValueError(detail::cat(path, ": not a regular file (", kind_of(type), ")"));
  }
  if (!read_stamp(h, stamp)) {
    const std::string why = last_error();
    CloseHandle(h);
    throw ResourceError(detail::cat(path, ": cannot stat (", why, ")"));
  }
  return file_of(h);
}

FileHandle open_direct(FileHandle file) {
  const HANDLE h = ReOpenFile(handle_of(file), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                              FILE_FLAG_NO_BUFFERING | FILE_FLAG_OVERLAPPED);
  return h == INVALID_HANDLE_VALUE ? kNoFile : file_of(h);
}

FileHandle duplicate(FileHandle file, const std::string& path) {
  HANDLE copy = nullptr;
  if (!DuplicateHandle(GetCurrentProcess(), handle_of(file), GetCurrentProcess(), &copy, 0, FALSE,
                       DUPLICATE_SAME_ACCESS))
    throw ResourceError(detail::cat(path, ": cannot open (", last_error(), ")"));
  return file_of(copy);
}

void close_file(FileHandle file) { CloseHandle(handle_of(file)); }

bool stamp_of(FileHandle file, FileStamp& stamp, std::string* why) {
  if (read_stamp(handle_of(file), stamp)) return true;
  if (why != nullptr) *why = last_error();
  return false;
}

uint64_t read_at(FileHandle file, char* dst, uint64_t n, uint64_t offset, const std::string& path) {
  if (n == 0) return 0;
  // Manual-reset, as GetOverlappedResult expects; each ReadFile resets it.
  const HANDLE event = CreateEventW(nullptr, TRUE, FALSE, nullptr);
  if (event == nullptr) throw ResourceError(detail::cat(path, ": cannot read (", last_error(), ")"));
  struct Closer {
    HANDLE h;
    ~Closer() { CloseHandle(h); }
  } closer{event};
  constexpr uint64_t kMostPerCall = 1ull << 30;  // a multiple of kDirectAlign, within a DWORD
  uint64_t done = 0;
  while (done < n) {
    const DWORD want = static_cast<DWORD>(std::min(n - done, kMostPerCall));
    const uint64_t got = read_once(handle_of(file), event, dst + done, want, offset + done, path);
    if (got == 0) break;
    done += got;
  }
  return done;
}

void drop_cached(FileHandle, uint64_t, uint64_t) {}  // Note [Windows file reads]

bool pages_cached(const void*, uint64_t) { return false; }  // Note [Windows file reads]: no cache to spare

char* map_buffer(uint64_t n, const std::string& path) {
  void* p = VirtualAlloc(nullptr, n, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
  if (p == nullptr)
    throw ResourceError(detail::cat(path, ": no memory for a ", n, "-byte read buffer (", last_error(), ")"));
  return static_cast<char*>(p);
}

void unmap_buffer(char* buffer, uint64_t) { VirtualFree(buffer, 0, MEM_RELEASE); }

void* map_file(FileHandle file, uint64_t size, const std::string& path) {
  const HANDLE mapping = CreateFileMappingW(handle_of(file), nullptr, PAGE_WRITECOPY, 0, 0, nullptr);
  if (mapping == nullptr) throw ResourceError(detail::cat(path, ": cannot map (", last_error(), ")"));
  void* base = MapViewOfFile(mapping, FILE_MAP_COPY, 0, 0, static_cast<SIZE_T>(size));
  const std::string why = base == nullptr ? last_error() : std::string();
  CloseHandle(mapping);  // the view keeps the mapping alive
  if (base == nullptr) throw ResourceError(detail::cat(path, ": cannot map (", why, ")"));
  return base;
}

void unmap_file(void* base, uint64_t) { UnmapViewOfFile(base); }

bool pages_unwritten(const void* p, uint64_t n) {
  if (n == 0) return true;
  return protections_unwritten(p, n) && working_set_unwritten(p, n);
}

std::vector<bool> pages_in_anonymous_ram(const std::vector<MemoryRange>& ranges) {
  std::vector<bool> out(ranges.size(), false);
  constexpr uint64_t kPage = 4096;
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].n == 0) continue;
    const char* at = static_cast<const char*>(ranges[r].p);
    const char* end = at + ranges[r].n;
    // Committed private memory (VirtualAlloc's, the heap's): never a file's view or a shared section.
    bool anonymous = true;
    while (anonymous && at < end) {
      MEMORY_BASIC_INFORMATION region{};
      anonymous = VirtualQuery(at, &region, sizeof region) != 0 && region.State == MEM_COMMIT &&
                  region.Type == MEM_PRIVATE;
      at = static_cast<const char*>(region.BaseAddress) + region.RegionSize;
    }
    // In the working set now: not paged out to the paging file.
    const uint64_t first = reinterpret_cast<uintptr_t>(ranges[r].p) / kPage;
    const uint64_t last = (reinterpret_cast<uintptr_t>(ranges[r].p) + ranges[r].n - 1) / kPage;
    for (uint64_t page = first; anonymous && page <= last;) {
      PSAPI_WORKING_SET_EX_INFORMATION pages[64];
      const uint64_t count = std::min<uint64_t>(64, last - page + 1);
      for (uint64_t i = 0; i < count; ++i) pages[i].VirtualAddress = reinterpret_cast<void*>((page + i) * kPage);
      anonymous = K32QueryWorkingSetEx(GetCurrentProcess(), pages, static_cast<DWORD>(count * sizeof pages[0]));
      for (uint64_t i = 0; anonymous && i < count; ++i)
        anonymous = pages[i].VirtualAttributes.Valid && !pages[i].VirtualAttributes.Shared;
      page += count;
    }
    out[r] = anonymous;
  }
  return out;
}

}  // namespace pins::files
