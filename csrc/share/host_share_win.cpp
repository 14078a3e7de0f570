// Note [Shared pins] (host_share.h) is Linux-only: its liveness rests on OFD
// locks and its segments on /dev/shm. On Windows attach() fails (reason
// "platform"): with `share:true` the process pins privately and says so once,
// as when sharing fails on Linux.
#include "csrc/share/host_share.h"

#include "csrc/base/check.h"

namespace pins::share {

struct HostShare::Impl {};

uint64_t key_hash(const Key& key) {
  uint64_t h = 1469598103934665603ull;
  for (const uint64_t v : {key.dev, key.ino, key.size, static_cast<uint64_t>(key.mtime_ns),
                           static_cast<uint64_t>(key.ctime_ns), key.offset, key.length})
    h = (h ^ v) * 1099511628211ull;
  return h;
}

HostShare::HostShare(std::unique_ptr<Impl> impl, std::string dir) : impl_(std::move(impl)), dir_(std::move(dir)) {}
HostShare::~HostShare() = default;

std::shared_ptr<HostShare> HostShare::attach(const ShareOptions&) {
  throw AttachError("platform", "share: PINS_CONF key 'share' is supported on Linux only; got share:true on Windows");
}

Grant HostShare::acquire(const Key&) { return {}; }
bool HostShare::publish(const Grant&) { return false; }
void HostShare::withdraw(const Grant&) {}
void HostShare::release(uint32_t, uint64_t, void*, uint64_t) {}
void HostShare::detach() {}
ShareStats HostShare::stats() { return {}; }

}  // namespace pins::share
