// Reading a byte range of a file into memory the caller owns (a pin), without
// leaving a second copy of it in the page cache (torch-free).
//
// Note [File reads]
// A pin filled through the file's mapping would fault every page into the
// page cache and copy it from there: the weight is then held twice, once
// pinned and once cached, until the kernel gets round to the cache, and each
// of those pages must first be found free (under memory pressure, by
// reclaim). pins reads the range itself instead, in kReadChunk chunks (on
// file-offset multiples of kReadChunk):
// - O_DIRECT where the filesystem allows it, through a second descriptor of
//   the same open file (opened through /proc/self/fd, so a file renamed or
//   replaced on disk after it was mapped is still the one read). The device
//   writes either straight into the destination, when its address is
//   congruent to the file offset modulo kDirectAlign (then only the range's
//   unaligned head and tail are read buffered), or, as for most safetensors
//   tensors (they start at 8 + header length + their offset), into an
//   aligned bounce buffer whose part in the range is copied out. Up to
//   `threads` threads take the chunks in turn, so one copies while another
//   waits on the device. The bounce buffers are kept for the next read (at
//   most kReadThreads idle, kReadChunk each): a fresh one faults its pages in
//   on the hot path. Two things set the speed of the bounce path
//   (docs/PERFORMANCE.md, "load"):
//   - The size of the requests. A request holds at most the device's
//     max_segments segments, and 4 KiB pages that are not physically
//     adjacent are a segment each, so a buffer of scattered pages cuts a
//     chunk into small requests (on the project's VM, 254 segments: about
//     1 MiB, where the device takes 4 MiB), and how scattered a fresh buffer is is luck (the fill's
//     speed varied 2x from one process to the next). The bounce buffers lie
//     on 2 MiB transparent huge pages where the kernel allows them.
//   - The copy's memory traffic, which competes with the device's own
//     writes into memory (in a VM, the host's copies: a thread copying
//     memory alongside a read slowed it by 8-17%, a thread spinning by
//     0-7%). A range of a chunk or more is copied with non-temporal stores
//     where the CPU has them (x86-64): they skip reading each destination
//     line into the cache first, a third of the traffic, and a range that
//     large would mostly have left the cache before the pin is read anyway.
// - Otherwise (tmpfs and some network filesystems refuse O_DIRECT) buffered
//   pread straight into the destination on the calling thread, then
//   posix_fadvise DONTNEED over the range, so the cache drops what the read
//   put there (pages another mapping has mapped stay). One thread: the
//   kernel's read-ahead keeps requests in flight already, and readers at
//   several offsets defeat it (on the project's machine 4 threads read a
//   512 MiB file at 0.63 of a raw O_DIRECT read, one at 0.94).
// pins-bench load measures both against a raw O_DIRECT read
// (docs/PERFORMANCE.md, "load"). On Windows, O_DIRECT is
// FILE_FLAG_NO_BUFFERING and there is no DONTNEED: Note [Windows file reads]
// (os_files_win.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "csrc/files/os_files.h"

namespace pins::files {

constexpr uint64_t kReadChunk = 8ull << 20;
constexpr uint64_t kDirectAlign = 4096;  // the largest logical block size in use
constexpr int kReadThreads = 4;

// How a read_range() went.
struct ReadResult {
  bool direct = false;     // O_DIRECT, else buffered + DONTNEED
  bool congruent = false;  // the destination congruent to the file offset: no bounce buffer
  bool streamed = false;   // copied out of bounce buffers with non-temporal stores
  int threads = 1;
};

// Reads [offset, offset + n) into dst. `file` is the file opened plainly,
// `direct` the same file through open_direct(), or kNoFile. Throws
// pins::ResourceError naming `path` on a read error, or on a file shorter than
// the range (naming where the file ends and the range); dst is then partly
// written.
ReadResult read_range(FileHandle file, FileHandle direct, const std::string& path, uint64_t offset, void* dst,
                      uint64_t n, int threads = kReadThreads);

}  // namespace pins::files
