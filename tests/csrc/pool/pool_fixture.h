// What the tests of the host pool and of the balancer above it share: a fence
// the test completes itself, and the pool the balancer's scenarios run on.
#pragma once

#include <atomic>

#include "csrc/base/size.h"
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
