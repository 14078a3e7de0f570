// Note [File reads] on Linux: what the page cache keeps of a read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "csrc/files/read.h"
#include "tests/csrc/files/temp_file.h"

namespace pins::files {
namespace {

using testing::TempFile;

TEST(FileReads, BufferedReadsLeaveNothingCached) {
  // Note [File reads]: after a buffered read the range is dropped from the page cache.
  TempFile f(4 << 20, 11);
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ::fsync(fd);  // clean pages, which the kernel may drop
  std::vector<char> dst(4 << 20);
  read_range(fd, kNoFile, f.path, 0, dst.data(), dst.size(), 2);
  void* map = ::mmap(nullptr, dst.size(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  std::vector<unsigned char> resident(dst.size() / 4096);
  ASSERT_EQ(0, ::mincore(map, dst.size(), resident.data()));
  size_t cached = 0;
  for (unsigned char r : resident) cached += r & 1;
  ::munmap(map, dst.size());
  ::close(fd);
  EXPECT_EQ(cached, 0u) << cached << " of " << resident.size() << " pages still cached";
}

}  // namespace
}  // namespace pins::files
