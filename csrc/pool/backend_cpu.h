// The system's virtual memory, shared by the cpu, cuda and hip backends: one
// implementation per system, backend_cpu_linux.cpp (mmap) and
// backend_cpu_win.cpp (VirtualAlloc), of which the build compiles one.
#pragma once

#include "csrc/pool/backend.h"

namespace pins {

class CpuBackend : public HostBackend {
 public:
  explicit CpuBackend(bool use_mlock);
  const char* name() const override { return "cpu"; }
  size_t page_size() const override { return page_; }
  bool can_lock() const override { return mlock_; }
  int reserve(size_t size, void** addr) override;
  int release(void* addr, size_t size) override;
  int commit(void* addr, size_t size) override;
  int decommit(void* addr, size_t size) override;
  int lock(void* addr, size_t size) override;
  int unlock(void* addr, size_t size) override;

 private:
  size_t page_;
  bool mlock_;
};

}  // namespace pins
