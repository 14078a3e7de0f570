// What the tests of the host pool and of the balancer above it share: a fence
// the test completes itself, and the pool the balancer's scenarios run on.
#pragma once

#include <atomic>
#include <cerrno>
#include <memory>

#include "csrc/base/size.h"
#include "csrc/pool/backend.h"
#include "csrc/pool/fence.h"
#include "csrc/pool/options.h"

namespace pins::testing {

// A copy in flight that ends when the test sets the flag, not when a device
// finishes it.
class FakeFence : public Fence {
 public:
  explicit FakeFence(std::atomic<bool>* flag) : flag_(flag) {}
  bool done() override { return flag_->load(); }

 private:
  std::atomic<bool>* flag_;
};

// Note [Refused page-locks]: a backend that refuses to page-lock a range of more
// than `max_lock` bytes, as cudaHostRegister does for large ranges on WSL2, and
// takes a smaller one without touching the OS (counting its calls); memory
// itself is `inner`'s.
class LockLimitBackend final : public HostBackend {
 public:
  LockLimitBackend(std::unique_ptr<HostBackend> inner, size_t max_lock) : max_(max_lock), inner_(std::move(inner)) {}
  const char* name() const override { return "lock-limit"; }
  size_t page_size() const override { return inner_->page_size(); }
  bool can_lock() const override { return true; }
  bool holds_bytes() const override { return inner_->holds_bytes(); }
  int reserve(size_t size, void** p) override { return inner_->reserve(size, p); }
  int release(void* p, size_t size) override { return inner_->release(p, size); }
  int commit(void* p, size_t size) override { return inner_->commit(p, size); }
  int decommit(void* p, size_t size) override { return inner_->decommit(p, size); }
  int lock(void*, size_t size) override {
    locks++;
    return size > max_.load() ? ENOMEM : 0;
  }
  int unlock(void*, size_t) override { return 0; }
  std::atomic<size_t> max_;
  std::atomic<int> locks{0};

 private:
  std::unique_ptr<HostBackend> inner_;
};

// 1 GiB segments, and no idle memory kept committed: whatever stays committed,
// the balancer's budget kept.
inline PoolOptions pool_opts() {
  PoolOptions o;
  o.segment_size = 1 * GiB;
  o.extent_min = 1 * MiB;
  o.retain_free = 0;
  return o;
}

}  // namespace pins::testing
