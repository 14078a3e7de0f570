// Note [Shared pins] (host_share.h): segment files, each named by its entry
// and generation: mapped, and removed once no valid entry names them.
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <vector>

#include "csrc/share/index_linux.h"
#include "csrc/share/share_testing.h"

namespace pins::share {
namespace {

std::atomic<int (*)(int, off_t)> g_reserve{nullptr};

}  // namespace

void testing::set_reserve(int (*reserve)(int fd, off_t length)) { g_reserve.store(reserve); }

int reserve_file(int fd, off_t length) {
  if (int (*seam)(int, off_t) = g_reserve.load()) return seam(fd, length);
  return posix_fallocate(fd, 0, length);
}

bool in_ram(int fd, std::string* type) {
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) {
    *type = "an unknown filesystem (" + errno_text(errno) + ")";
    return false;
  }
  const auto magic = static_cast<unsigned long>(fs.f_type);
  if (magic == TMPFS_MAGIC || magic == RAMFS_MAGIC) return true;
  switch (magic) {
    case EXT4_SUPER_MAGIC: *type = "ext2/3/4"; break;
    case BTRFS_SUPER_MAGIC: *type = "btrfs"; break;
    case XFS_SUPER_MAGIC: *type = "xfs"; break;
    case OVERLAYFS_SUPER_MAGIC: *type = "overlayfs"; break;
    case NFS_SUPER_MAGIC: *type = "nfs"; break;
    default: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%lx", magic);
      *type = std::string("a filesystem of type ") + hex;
    }
  }
  return false;
}

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
