// Note [Shared pins] (host_share.h): the locks on the index file. The index
// lock (byte 0) serializes every read and write of the index; each slot's byte
// is held by its process for its life, so the kernel tells a dead one.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "csrc/share/index_linux.h"

namespace pins::share {

bool ofd_lock(int fd, short type, off_t byte, bool wait) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  for (;;) {
    if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return true;
    if (errno == EINTR) continue;
    return false;
  }
}

bool held_by_other(int fd, off_t byte) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;  // cannot tell: assume alive (never drops a live lease)
  return fl.l_type != F_UNLCK;
}

bool HostShare::Impl::usable() const { return !detached && pid == getpid(); }

void HostShare::Impl::lock() {
  mu.lock();
  if (fd < 0) return;  // detached: nothing of the index is touched
  while (!ofd_lock(fd, F_WRLCK, kIndexLockByte, true)) {
    // EDEADLK and the like cannot happen for one byte locked by one description; retry after a beat.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void HostShare::Impl::unlock() {
  if (fd >= 0) ofd_lock(fd, F_UNLCK, kIndexLockByte, false);
  mu.unlock();
}

}  // namespace pins::share
