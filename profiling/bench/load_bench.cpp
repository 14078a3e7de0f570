// pins-bench load: a weight read from its file into a pin without a second
// copy in RAM (docs/PERFORMANCE.md, "load"), against a raw sequential O_DIRECT read
// of the same file measured in the same run.
//   raw    the whole file, 8 MiB O_DIRECT requests in turn on one thread into
//          one buffer on huge pages (dd iflag=direct bs=8M, with the largest
//          requests the device takes): what the disk gives.
//   pins   files::fill_from_file, the cast path's fill of a new pin whose
//          source is a mapped file's unwritten bytes (Note [File-backed pins]):
//          the file's data section (from offset 8 + a header length, unaligned,
//          as in a safetensors file) into a warm, page-aligned destination, as
//          a pin: O_DIRECT through bounce buffers, or buffered reads and
//          DONTNEED where the filesystem refuses O_DIRECT (Note [File reads]).
//   direct the same into a destination congruent to the file offset, so the
//          aligned part is read with O_DIRECT straight into it.
//   mmap   the same bytes copied through a private mapping (what filling a pin
//          from the mapped tensor does): every page faulted into the page cache.
// The file is dropped from the page cache before every read (posix_fadvise
// DONTNEED, on a file written and synced first) and the pages that stay
// resident are counted with mincore: after `pins` none should, after `mmap`
// the whole range does (the weight held twice: pinned and cached).
// Ratios are throughputs over raw's: 1.0 reads as fast as the disk allows.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/files/mapped.h"
#include "csrc/files/read.h"
#include "profiling/bench/args.h"
#include "profiling/bench/timing.h"

namespace pins::bench {
namespace {

constexpr uint64_t kHeaderBytes = 8 + 1234;  // where the data starts: unaligned, as a safetensors header leaves it

struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

void write_file(const std::string& path, uint64_t size) {
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (f.fd < 0) fail("cannot create " + path);
  std::vector<uint64_t> block((8u << 20) / 8);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint64_t done = 0; done < size;) {
    for (uint64_t& v : block) v = (x = x * 6364136223846793005ull + 1442695040888963407ull);
    const uint64_t n = std::min<uint64_t>(size - done, block.size() * 8);
    if (::write(f.fd, block.data(), n) != static_cast<ssize_t>(n)) fail("cannot write " + path);
    done += n;
  }
  if (::fsync(f.fd) != 0) fail("cannot sync " + path);
}

// Drops the file from the page cache and returns how many of its pages stay.
void drop(int fd, uint64_t size) { ::posix_fadvise(fd, 0, static_cast<off_t>(size), POSIX_FADV_DONTNEED); }

uint64_t resident_pages(int fd, uint64_t offset, uint64_t n) {
  void* map = ::mmap(nullptr, offset + n, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) fail("mmap for mincore");
  const uint64_t first = offset / 4096, last = (offset + n - 1) / 4096;
  std::vector<unsigned char> v(last + 1);
  if (::mincore(map, offset + n, v.data()) != 0) fail("mincore");
  ::munmap(map, offset + n);
  uint64_t r = 0;
  for (uint64_t i = first; i <= last; ++i) r += v[i] & 1;
  return r;
}

uint64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) << 10;
  return 0;
}

std::string gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  return buf;
}

}  // namespace

int load_main(const std::vector<std::string>& args) {
  uint64_t size = 1ull << 30;
  int reps = 3;
  std::string dir = ".";
  int threads = files::kReadThreads;
  Args a(args);
  while (a.next()) {
    if (a.is("--size")) size = a.size();
    else if (a.is("--reps")) reps = a.positive();
    else if (a.is("--dir")) dir = a.value();
    else if (a.is("--threads")) threads = a.positive();
    else a.unknown();
  }
  if (size <= kHeaderBytes) throw std::invalid_argument("--size must exceed " + std::to_string(kHeaderBytes) + " bytes");
  const std::string path = dir + "/pins-bench-load.bin";
  write_file(path, size);
  struct Remove {
    std::string p;
    ~Remove() { std::remove(p.c_str()); }
  } remove_file{path};
  const uint64_t offset = kHeaderBytes, n = size - kHeaderBytes;

  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) fail("cannot open " + path);
  Fd dfd(files::open_direct(fd.fd));
  std::printf("file %s, %s; data section from byte %llu; O_DIRECT %s\n", path.c_str(), gib(size).c_str(),
              static_cast<unsigned long long>(offset), dfd.fd >= 0 ? "available" : "refused by the filesystem");

  // On 2 MiB huge pages: an O_DIRECT request holds at most the device's
  // max_segments segments and scattered 4 KiB pages are a segment each, so on
  // 4 KiB pages the baseline's speed depends on how physically adjacent its
  // buffer's pages happen to be (docs/PERFORMANCE.md, "load").
  constexpr uint64_t kHugePage = 2ull << 20;
  std::unique_ptr<char, decltype(&std::free)> raw_buf(
      static_cast<char*>(std::aligned_alloc(kHugePage, files::kReadChunk)), &std::free);
  if (!raw_buf) throw std::runtime_error("no memory for the raw read's buffer");
  ::madvise(raw_buf.get(), files::kReadChunk, MADV_HUGEPAGE);
  std::memset(raw_buf.get(), 0, files::kReadChunk);
  std::unique_ptr<char, decltype(&std::free)> dst_buf(static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)),
                                                      &std::free);
  if (!dst_buf) throw std::runtime_error("no memory for the destination");
  struct {
    char* p;
    char* data() const { return p; }
  } dst{dst_buf.get()};
  std::memset(dst.data(), 1, n);  // warm, as a pin reusing evicted memory
  const auto shared = files::MappedFile::open(path);

  // A destination whose address is congruent to the file offset (Note [File reads]).
  std::vector<char> dst2(n + files::kDirectAlign);
  char* congruent = dst2.data() + ((offset - reinterpret_cast<uintptr_t>(dst2.data())) % files::kDirectAlign);
  std::memset(congruent, 1, n);
  bool direct_used = false;
  std::vector<double> raw_s, pins_s, direct_s, mmap_s;
  uint64_t cached_pins = 0, cached_direct = 0, cached_mmap = 0, cold_before = 0;
  const uint64_t pages = (offset + n - 1) / 4096 - offset / 4096 + 1;
  for (int rep = 0; rep < reps; ++rep) {
    drop(fd.fd, size);
    cold_before = std::max(cold_before, resident_pages(fd.fd, offset, n));
    raw_s.push_back(time_seconds([&] {
      const int from = dfd.fd >= 0 ? dfd.fd : fd.fd;
      for (uint64_t at = 0; at < size;) {
        const ssize_t r = ::pread(from, raw_buf.get(), files::kReadChunk, static_cast<off_t>(at));
        if (r <= 0) fail("raw read of " + path);
        at += static_cast<uint64_t>(r);
      }
      keep(raw_buf.get());
    }));

    drop(fd.fd, size);
    pins_s.push_back(time_seconds([&] {
      if (!files::fill_from_file(shared->data() + offset, n, dst.data(), threads))
        throw std::runtime_error("fill_from_file refused a mapped, unwritten range");
      keep(dst.data());
    }));
    cached_pins = std::max(cached_pins, resident_pages(fd.fd, offset, n));

    drop(fd.fd, size);
    direct_s.push_back(time_seconds([&] {
      direct_used = files::read_range(fd.fd, dfd.fd, path, offset, congruent, n, threads).direct;
      keep(congruent);
    }));
    cached_direct = std::max(cached_direct, resident_pages(fd.fd, offset, n));

    drop(fd.fd, size);
    {
      // A private mapping of its own, so the pages it faults in are its alone.
      void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
      if (map == MAP_FAILED) fail("mmap " + path);
      mmap_s.push_back(time_seconds([&] {
        std::memcpy(dst.data(), static_cast<char*>(map) + offset, n);
        keep(dst.data());
      }));
      ::munmap(map, size);
    }
    cached_mmap = std::max(cached_mmap, resident_pages(fd.fd, offset, n));
  }
  std::printf("%d repetitions, each read after dropping the file from the page cache (at most %llu of %llu pages "
              "resident before a read)\n",
              reps, static_cast<unsigned long long>(cold_before), static_cast<unsigned long long>(pages));
  const double gb = static_cast<double>(n) / 1e9;
  print_reps("raw O_DIRECT sequential, 8M", raw_s, 1e3, "ms");
  print_reps("pins fill from the file", pins_s, 1e3, "ms");
  print_reps(direct_used ? "O_DIRECT, congruent destination" : "congruent destination (buffered)", direct_s, 1e3,
             "ms");
  print_reps("copy through the mapping", mmap_s, 1e3, "ms");
  const double raw_bw = static_cast<double>(size) / 1e9 / median(raw_s);
  const double pins_bw = gb / median(pins_s), direct_bw = gb / median(direct_s), mmap_bw = gb / median(mmap_s);
  std::printf("throughput: raw %.2f GB/s, pins %.2f GB/s, congruent %.2f GB/s, through the mapping %.2f GB/s\n",
              raw_bw, pins_bw, direct_bw, mmap_bw);
  std::printf("page cache after the read: pins %llu of %llu pages, congruent %llu, through the mapping %llu (the "
              "weight held twice)\n",
              static_cast<unsigned long long>(cached_pins), static_cast<unsigned long long>(pages),
              static_cast<unsigned long long>(cached_direct), static_cast<unsigned long long>(cached_mmap));
  std::printf("process RSS %s with the %s destination\n", gib(rss_bytes()).c_str(), gib(n).c_str());
  const files::FileFillStats fs = files::file_fill_stats();
  std::printf("fills from the file: %llu, %llu with O_DIRECT\n", static_cast<unsigned long long>(fs.fills),
              static_cast<unsigned long long>(fs.direct));
  std::printf("RESULT load_ratio=%.3f direct_ratio=%.3f mmap_ratio=%.3f cached_after_pins_pct=%.1f "
              "cached_after_mmap_pct=%.1f\n",
              pins_bw / raw_bw, direct_bw / raw_bw, mmap_bw / raw_bw, 100.0 * static_cast<double>(cached_pins) / static_cast<double>(pages),
              100.0 * static_cast<double>(cached_mmap) / static_cast<double>(pages));
  return 0;
}

}  // namespace pins::bench
