// A completion fence recorded against a pool block: the block is neither reused
// nor decommitted until every fence recorded on it is done(). The torch adapter
// implements it with c10::Event; tests use fakes. done() may call the driver, so
// the pool never calls it while holding its lock.
#pragma once

namespace pins {

class Fence {
 public:
  virtual ~Fence() = default;
  virtual bool done() = 0;  // non-blocking query
};

}  // namespace pins
