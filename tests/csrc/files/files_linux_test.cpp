// Note [File reads] on Linux: what the page cache keeps of a read; Note [Content
// check]: the pages a child of fork() reads are its own.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "csrc/files/os_files.h"
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

// Note [Content check]: pagemap is opened once per process; a child of fork()
// reads its own pages, not the parent's through the inherited descriptor.
TEST(MemoryPages, AChildOfForkReadsItsOwnPages) {
  std::vector<char> heap(4096, 'x');
  ASSERT_EQ(pages_in_anonymous_ram({{heap.data(), heap.size()}}), std::vector<bool>{true});  // opened here
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Only the child has this mapping: through the parent's pagemap it would read as absent.
    void* mine = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mine == MAP_FAILED) std::_Exit(2);
    static_cast<char*>(mine)[0] = 1;
    std::_Exit(pages_in_anonymous_ram({{mine, 4096}}) == std::vector<bool>{true} ? 0 : 1);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child read its pages through the parent's";
  EXPECT_EQ(pages_in_anonymous_ram({{heap.data(), heap.size()}}), std::vector<bool>{true});
}

}  // namespace
}  // namespace pins::files
