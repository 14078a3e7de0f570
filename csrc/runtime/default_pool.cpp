#include "csrc/runtime/default_pool.h"

#include <mutex>

namespace pins {

HostPool& default_pool() {
  static std::mutex mu;
  static HostPool* pool = nullptr;  // never destroyed: tensors may outlive static destruction
  std::lock_guard<std::mutex> g(mu);
  if (pool == nullptr) {
    const Config c = config_from_env();
    pool = new HostPool(make_backend(c.backend, c.mlock), PoolOptions::from(c));
  }
  return *pool;
}

}  // namespace pins
