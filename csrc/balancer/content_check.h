// A pin's check of its source's bytes on a hit: which windows of the source it
// samples, and the comparison.
//
// Note [Content check]
// Writes that no version counter sees (an inference tensor written in place,
// `.data`, numpy aliases, `untyped_storage().copy_()`: Note [Pin validity])
// leave a pin holding bytes its source no longer has. So, with the
// `content_check` key on (off by default, below), a hit compares a few small
// windows of the source with what the pin holds there;
// when one differs the pin is dropped and made again, and the cast is served
// with the source's bytes as they are now (counted as `content_mismatches`,
// per model and subset).
//
// The windows are fixed per pin when it is made (content_windows): the source's
// first and last kContentWindowBytes bytes, and one more in each half of the
// rest at a 32-byte-aligned offset drawn from the pin's key; a source of at most
// kContentWindows x kContentWindowBytes bytes is compared whole. Offsets count
// in the order of the source's elements (the pin's order); a non-contiguous
// source's window is cut to the run of elements that lies contiguous in its
// storage from the window's first element. A gathered pin samples each part.
// What the pin holds in each window is copied beside it (ContentSample) when
// the pin is made, from the source, just before the fill copies the same bytes
// into the pin; a hit reads the source's windows and that copy, not the pin,
// so it touches at most kContentWindows lines of the source and none of the
// pinned block. (A write between the sample and the fill only makes the next
// hit pin again.)
//
// No disk reads: a window is sampled only where its memory has no file behind
// it, as known when the pin is made: the source's storage came from torch's
// CPU allocator (malloc'd: anonymous memory; the common case, and no syscall),
// or else every page the window lies in is private anonymous memory in RAM
// (pages_in_anonymous_ram in csrc/files/os_files.h: /proc/self/pagemap on
// Linux, opened once per process). A page of a file mapping (pins.load_file's,
// safetensors' own mmap, torch.from_file) or of shared memory, or one not
// yet faulted in, is never read by the check: reading it could read the disk,
// which pins exists to avoid. A rewrite of a load_file file is Note [Changed
// files]'s. Left: an anonymous page that the system swaps out after the pin
// was made is read back from swap by the next hit's check (at most one or two
// pages per window).
//
// Caught: a write that changes a sampled byte, such as any whole-tensor
// in-place op that changes the values (`mul_`, `add_`, `copy_` of other
// weights, a LoRA merged into the weight). Not caught: a write that leaves
// every window as it was: a sparse or partial write (some rows of a large
// weight; a small update that rounds to no change where the windows lie), a
// write to pages that were not anonymous in RAM when the pin was made, a
// source where /proc/self/pagemap cannot be read (nothing is sampled). Those
// stay the caller's to report (Balancer::invalidate, a new signature).
//
// The check runs while the `content_check` key is on; it is off by default:
// on a hit whose source is out of the caches and the TLB, as a weight's is
// between two uses in a workflow, reading the windows adds more than the 0.2 us
// a hit could take on for the check to be on by default (`pins-bench cast`: +0.02 us
// hot, up to +0.2 us for a 4 KiB source cold, +0.3 to +0.55 us for a 64 KiB one,
// whose windows lie in four pages; docs/PERFORMANCE.md "the content check"). A
// pin made while it was off has no windows and is never checked.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace pins {

constexpr int kContentWindows = 4;
constexpr uint64_t kContentWindowBytes = 32;

// A byte range of a source, from its first byte.
struct Window {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool operator==(const Window&) const = default;
};

// Note [Content check]: the windows of a source of `nbytes` bytes, fixed by
// `seed` (the pin key's hash), in offset order and disjoint. Offsets and sizes
// are multiples of any element size dividing both kContentWindowBytes and
// `nbytes`. None for an empty source.
std::vector<Window> content_windows(uint64_t nbytes, uint64_t seed);

// One source's sampled windows and the bytes each held when sampled.
class ContentSample {
 public:
  // Records [offset, offset + bytes) of the source whose first byte is at
  // `source`, as it is now. At most kContentWindows windows of at most
  // kContentWindowBytes bytes each (an internal assert).
  void add(const char* source, uint64_t offset, uint64_t bytes);
  int windows() const { return count_; }
  // The bytes from the source's first byte that the windows reach.
  uint64_t reach() const { return reach_; }
  // Whether the source whose first byte is at `source` holds every window's
  // recorded bytes. Reads only the windows.
  bool matches(const char* source) const {
    for (int i = 0; i < count_; ++i)
      if (std::memcmp(source + offset_[i], bytes_ + i * kContentWindowBytes, bytes_of_[i]) != 0) return false;
    return true;
  }

 private:
  uint64_t offset_[kContentWindows] = {};
  uint32_t bytes_of_[kContentWindows] = {};
  int count_ = 0;
  uint64_t reach_ = 0;
  char bytes_[kContentWindows * kContentWindowBytes] = {};
};

}  // namespace pins
