// The file reads on Windows (os_files_win.cpp, Note [Windows file reads]):
// FILE_FLAG_NO_BUFFERING, UTF-8 paths, what is not a regular file.
#include <gtest/gtest.h>

#include <windows.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "csrc/base/check.h"
#include "csrc/files/read.h"
#include "tests/csrc/files/temp_file.h"

namespace pins::files {
namespace {

using testing::TempFile;

// A path std::filesystem reads as the UTF-8 it is (a plain string is the
// system's code page there).
std::filesystem::path fs_path(const std::string& utf8) { return std::u8string(utf8.begin(), utf8.end()); }

// dst inside `buf`, congruent to `offset` modulo kDirectAlign, or `skew` bytes off it.
char* placed(std::vector<char>& buf, uint64_t offset, uint64_t skew) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + (offset - base) % kDirectAlign + skew;
}

TEST(FileReadsWindows, NoBufferingReadsTheFilesBytesAlignedOrNot) {
  const uint64_t size = 2 * kReadChunk + 5000;
  TempFile f(size, 17);
  FileStamp stamp;
  const FileHandle fd = open_regular(f.path, stamp);
  EXPECT_EQ(stamp.size, size);
  const FileHandle dfd = open_direct(fd);
  ASSERT_NE(dfd, kNoFile) << "the temp directory's volume refuses FILE_FLAG_NO_BUFFERING";
  std::vector<char> buf(size + 2 * kDirectAlign);
  // Aligned ends into congruent memory: NO_BUFFERING straight in. Then odd
  // ends, and memory one byte off (through bounce buffers).
  const struct {
    uint64_t offset, n, skew;
  } cases[] = {{0, size, 0}, {4096, kReadChunk, 0}, {1242, size - 1242, 0}, {1242, size - 2000, 1}, {7, 3, 1}};
  for (const auto& c : cases) {
    char* dst = placed(buf, c.offset, c.skew);
    const ReadResult how = read_range(fd, dfd, f.path, c.offset, dst, c.n, 3);
    EXPECT_TRUE(how.direct);
    EXPECT_EQ(how.congruent, c.skew == 0);
    EXPECT_EQ(0, std::memcmp(dst, f.bytes.data() + c.offset, c.n)) << "offset " << c.offset << " n " << c.n;
  }
  close_file(dfd);
  close_file(fd);
}

TEST(FileReadsWindows, AUtf8PathNamesItsFile) {
  TempFile f(10000, 23);
  // "pins_été_模型.safetensors", in UTF-8
  const std::string name = f.path + "_\xc3\xa9t\xc3\xa9_\xe6\xa8\xa1\xe5\x9e\x8b.safetensors";
  std::filesystem::copy_file(fs_path(f.path), fs_path(name), std::filesystem::copy_options::overwrite_existing);
  FileStamp stamp;
  const FileHandle fd = open_regular(name, stamp);
  EXPECT_EQ(stamp.size, 10000u);
  std::vector<char> dst(10000);
  read_range(fd, kNoFile, name, 0, dst.data(), dst.size());
  EXPECT_EQ(0, std::memcmp(dst.data(), f.bytes.data(), dst.size()));
  close_file(fd);
  std::filesystem::remove(fs_path(name));
}

TEST(FileReadsWindows, ADirectoryIsNotARegularFile) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  FileStamp stamp;
  try {
    open_regular(dir, stamp);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(": not a regular file (a directory)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(open_regular(dir + "\\nothing-here.safetensors", stamp), ResourceError);
}

TEST(FileReadsWindows, AStampSeesARewrite) {
  TempFile f(5000, 29);
  FileStamp before, after;
  const FileHandle fd = open_regular(f.path, before);
  Sleep(20);  // past the file system's timestamp granularity
  f.write(std::string(6000, 'x'));
  ASSERT_TRUE(stamp_of(fd, after));
  EXPECT_EQ(after.size, 6000u);
  EXPECT_NE(after, before);
  close_file(fd);
}

}  // namespace
}  // namespace pins::files
