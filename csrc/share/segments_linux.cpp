// Note [Shared pins] (host_share.h): segment files, each named by its entry
// and generation: mapped, and removed once no valid entry names them.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "csrc/share/index_linux.h"

namespace pins::share {

void HostShare::Impl::sweep_files() {
  const int d = dup(dir_fd);
  if (d < 0) return;
  DIR* dp = fdopendir(d);
  if (dp == nullptr) {
    close(d);
    return;
  }
  rewinddir(dp);
  std::vector<std::string> doomed;
  while (const dirent* de = readdir(dp)) {
    const std::string name = de->d_name;
    if (name.rfind("seg-", 0) != 0) continue;
    unsigned long long idx = 0, gen = 0;
    char tail = 0;
    bool keep = false;
    if (std::sscanf(name.c_str(), "seg-%llu-%llu%c", &idx, &gen, &tail) == 2 && idx < kEntries) {
      const Entry& e = entry(static_cast<uint32_t>(idx));
      keep = entry_valid(e) && (e.state == kWriting || e.state == kReady) && e.generation == gen &&
             segment_name(static_cast<uint32_t>(idx), gen) == name;
    }
    if (!keep) doomed.push_back(name);
  }
  closedir(dp);
  for (const std::string& n : doomed) unlinkat(dir_fd, n.c_str(), 0);
}

void* HostShare::Impl::map_segment(int seg_fd, uint64_t length) {
  void* p = mmap(nullptr, round_page(length), PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void* HostShare::Impl::open_ready(uint32_t i, uint64_t gen, uint64_t length, bool& gone) {
  const int s = openat(dir_fd, segment_name(i, gen).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  gone = s < 0 && errno == ENOENT;
  if (s < 0) return nullptr;
  struct stat st {};
  void* p = nullptr;
  if (fstat(s, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 077) == 0 &&
      static_cast<uint64_t>(st.st_size) >= round_page(length))
    p = map_segment(s, length);
  close(s);
  return p;
}

}  // namespace pins::share
