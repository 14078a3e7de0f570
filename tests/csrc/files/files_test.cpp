// Note [File reads] and Note [File-backed pins]: bytes read from the file are
// the file's, at any offset and size, on any thread count, direct or not; a
// page written through the mapping stops the file from being used.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/files/mapped.h"
#include "csrc/files/os_files.h"
#include "csrc/files/read.h"
#include "tests/csrc/files/temp_file.h"

namespace pins::files {
namespace {

using testing::TempFile;

// `path` opened plainly, for read_range.
FileHandle open_plain(const std::string& path) {
  FileStamp stamp;
  return open_regular(path, stamp);
}

// Reads [offset, offset + n) into a buffer placed so that its address is
// congruent to the file offset modulo kDirectAlign (`congruent`: O_DIRECT
// straight into it, Note [File reads]) or one byte off it (through a bounce
// buffer); `direct` false reads buffered.
void expect_range(const TempFile& f, bool direct, bool congruent, uint64_t offset, uint64_t n, int threads) {
  const FileHandle fd = open_plain(f.path);
  const FileHandle dfd = direct ? open_direct(fd) : kNoFile;
  std::vector<char> buf(n + 2 * kDirectAlign + 2, '\x01');
  const uintptr_t base = reinterpret_cast<uintptr_t>(buf.data()) + 1;
  char* dst = buf.data() + 1 + (offset - base) % kDirectAlign + (congruent ? 0 : 1);
  const ReadResult how = read_range(fd, dfd, f.path, offset, dst, n, threads);
  EXPECT_EQ(how.direct, dfd != kNoFile);
  EXPECT_EQ(how.congruent, congruent);
#if defined(__x86_64__)
  EXPECT_EQ(how.streamed, dfd != kNoFile && !congruent && n >= kReadChunk);  // Note [File reads]: non-temporal stores
#else
  EXPECT_FALSE(how.streamed);
#endif
  EXPECT_EQ(0, std::memcmp(dst, f.bytes.data() + offset, n)) << "offset " << offset << " n " << n;
  EXPECT_EQ(dst[-1], '\x01');  // nothing written outside the range
  EXPECT_EQ(dst[n], '\x01');
  if (dfd != kNoFile) close_file(dfd);
  close_file(fd);
}

TEST(FileReads, BitExactAtOddOffsetsAndSizesOnAnyThreadCount) {
  const uint32_t seed = std::random_device{}();
  std::printf("FileReads seed=%u\n", seed);
  const uint64_t size = 3 * kReadChunk + 12345;
  TempFile f(size, seed);
  std::mt19937_64 rng(seed);
  for (bool direct : {true, false}) {
    for (bool congruent : {true, false}) {
      expect_range(f, direct, congruent, 0, size, 4);  // the whole file
      expect_range(f, direct, congruent, 1, size - 2, 3);
      expect_range(f, direct, congruent, kReadChunk - 1, 2, 2);  // across a chunk boundary
      expect_range(f, direct, congruent, 4095, 4097, 1);
      // Copied out with non-temporal stores: pieces of 3 bytes, a whole chunk, 67 bytes.
      expect_range(f, direct, congruent, kReadChunk - 3, kReadChunk + 70, 3);
      expect_range(f, direct, congruent, 4096, 3 * kReadChunk, 4);  // aligned ends, the file's end after them
      for (int i = 0; i < 6; ++i) {
        const uint64_t off = rng() % size;
        const uint64_t n = 1 + rng() % (size - off);
        expect_range(f, direct, congruent, off, n, 1 + static_cast<int>(rng() % 4));
      }
    }
  }
}

TEST(FileReads, AFileShorterThanTheRangeIsAnErrorNamingIt) {
  TempFile f(10000, 7);
  const FileHandle fd = open_plain(f.path);
  std::vector<char> dst(20000);
  for (FileHandle dfd : {open_direct(fd), kNoFile}) {
    try {
      read_range(fd, dfd, f.path, 5000, dst.data(), 6000);
      ADD_FAILURE() << "no error";
    } catch (const ResourceError& e) {
      EXPECT_NE(std::string(e.what()).find(f.path + ": the file ends at 10000"), std::string::npos) << e.what();
    }
    if (dfd != kNoFile) close_file(dfd);
  }
  close_file(fd);
}

TEST(FileReads, AShortFileNamesItsRealEndWhicheverThreadFailsFirst) {
  // Threads reading chunks past the end see nothing at their chunk's start,
  // and may well fail before the one that reads up to the end: the message
  // must name the file's end all the same.
  const uint64_t size = 4195464;  // 4 MiB + 1160: inside the first of three chunks
  TempFile f(size, 13);
  const FileHandle fd = open_plain(f.path);
  const FileHandle dfd = open_direct(fd);
  const uint64_t n = 20 << 20;
  std::vector<char> buf(n + 2 * kDirectAlign);
  char* aligned = buf.data() + (kDirectAlign - reinterpret_cast<uintptr_t>(buf.data()) % kDirectAlign);
  // The last range starts past the end: every thread sees nothing at its first byte.
  for (const uint64_t offset : {uint64_t{0}, uint64_t{1242}, uint64_t{10} << 20}) {
    // Congruent to the file offset (O_DIRECT straight in), then one byte off (through bounce buffers).
    for (char* dst : {aligned + offset % kDirectAlign, aligned + offset % kDirectAlign + 1}) {
      for (const FileHandle d : {dfd, kNoFile}) {
        for (int rep = 0; rep < 10; ++rep) {
          try {
            EXPECT_EQ(read_range(fd, d, f.path, offset, dst, n, 4).congruent, dst == aligned + offset % kDirectAlign);
            ADD_FAILURE() << "no error";
          } catch (const ResourceError& e) {
            const std::string want = detail::cat(f.path, ": the file ends at ", size, ", short of the range read (", n,
                                                 " bytes from offset ", offset, ")");
            EXPECT_EQ(std::string(e.what()), want) << "direct " << (d != kNoFile) << " rep " << rep;
          }
        }
      }
    }
  }
  if (dfd != kNoFile) close_file(dfd);
  close_file(fd);
}

TEST(MappedFiles, AnOpenThatFailsLeavesTheMappedCountAsItWas) {
  // A missing path and a directory, both refused after the MappedFile that
  // would hold them was made (it used to be uncounted without being counted).
  const uint64_t before = file_fill_stats().mapped_files;
  TempFile f(4096, 1);
  for (const std::string& path : {f.path + ".missing", std::string("/")}) {
    EXPECT_ANY_THROW(MappedFile::open(path)) << path;
    EXPECT_EQ(file_fill_stats().mapped_files, before) << path;
  }
  {
    auto m = MappedFile::open(f.path);
    EXPECT_EQ(file_fill_stats().mapped_files, before + 1);
  }
  EXPECT_EQ(file_fill_stats().mapped_files, before);
}

TEST(MappedFiles, FindsRangesOnlyInsideALiveMapping) {
  TempFile f(3 * 4096 + 100, 3);
  FileRange r;
  const char* base = nullptr;
  {
    auto m = MappedFile::open(f.path);
    base = m->data();
    EXPECT_EQ(file_fill_stats().mapped_files >= 1, true);
    ASSERT_TRUE(find_mapped(base + 10, 100, r));
    EXPECT_EQ(r.offset, 10u);
    EXPECT_EQ(r.file.get(), m.get());
    r.file.reset();
    EXPECT_TRUE(find_mapped(base, m->size(), r));
    r.file.reset();
    EXPECT_FALSE(find_mapped(base + 10, m->size(), r));  // runs past the end
    EXPECT_FALSE(find_mapped(base - 1, 2, r));
  }
  EXPECT_FALSE(find_mapped(base + 10, 100, r));  // unmapped with its last holder
  EXPECT_THROW(MappedFile::open("/nonexistent/pins.safetensors"), ResourceError);
}

TEST(MappedFiles, AWrittenPageStopsTheFileFromBeingRead) {
  TempFile f(5 * 4096, 5);
  auto m = MappedFile::open(f.path);
  char* p = m->data();
  EXPECT_TRUE(pages_unwritten(p, m->size()));  // nothing touched yet
  volatile char sink = p[4096 * 2 + 7];        // read: a page of the page cache
  (void)sink;
  EXPECT_TRUE(pages_unwritten(p, m->size()));
  std::vector<char> dst(4096 * 3);
  const FileFillStats before = file_fill_stats();
  ASSERT_TRUE(fill_from_file(p + 4096, dst.size(), dst.data()));
  EXPECT_EQ(0, std::memcmp(dst.data(), f.bytes.data() + 4096, dst.size()));
  EXPECT_EQ(file_fill_stats().fills, before.fills + 1);
  EXPECT_EQ(file_fill_stats().bytes, before.bytes + dst.size());

  p[4096 * 3 + 1] = static_cast<char>(p[4096 * 3 + 1] ^ 0xff);  // an in-place write: copy-on-write
  EXPECT_FALSE(pages_unwritten(p + 4096, dst.size()));
  EXPECT_TRUE(pages_unwritten(p, 4096 * 3));  // the other pages still hold the file's bytes
  EXPECT_FALSE(fill_from_file(p + 4096, dst.size(), dst.data()));
  EXPECT_EQ(file_fill_stats().written, before.written + 1);
  // The file itself never changed.
  std::ifstream in(f.path, std::ios::binary);
  std::string now((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(now, f.bytes);
  // Memory no mapping holds is not a file's.
  std::vector<char> heap(100);
  EXPECT_FALSE(fill_from_file(heap.data(), heap.size(), dst.data()));
}

// Note [Content check] (csrc/balancer/content_check.h): a hit's check reads a
// window only where it lay in private anonymous memory in RAM, never a file's
// page (which could read the disk).
TEST(MemoryPages, OnlyPrivateAnonymousMemoryInRamCounts) {
  std::vector<char> heap(3 * 4096, 'x');  // written: in RAM
  TempFile f(5 * 4096, 6);
  auto m = MappedFile::open(f.path);
  char* p = m->data();
  volatile char sink = p[4096 + 3];  // read: a page of the page cache, mapped
  (void)sink;
  const std::vector<bool> got = pages_in_anonymous_ram(
      {{heap.data(), heap.size()}, {heap.data() + 5, 1}, {p, 10}, {p + 4096, 100}, {p + 4 * 4096, 8}, {heap.data(), 0}});
  EXPECT_EQ(got, (std::vector<bool>{true, true, false, false, false, false}))
      << "heap, heap, a file page never touched, a file page read, one never touched, an empty range";
  EXPECT_TRUE(pages_in_anonymous_ram({}).empty());
#ifndef _WIN32
  p[2 * 4096] = static_cast<char>(p[2 * 4096] ^ 1);  // copy-on-write: now an anonymous page of this process
  EXPECT_EQ(pages_in_anonymous_ram({{p + 2 * 4096, 8}}), std::vector<bool>{true});
  EXPECT_EQ(pages_in_anonymous_ram({{p + 2 * 4096 - 4, 8}}), std::vector<bool>{false}) << "half on a file page";
#endif
}

}  // namespace
}  // namespace pins::files
