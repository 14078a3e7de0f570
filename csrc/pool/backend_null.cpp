// The null backend: address bookkeeping only, for the simulator and tests that
// need sizes no machine has.
#include <atomic>
#include <cstdint>

#include "csrc/pool/backend.h"

namespace pins {
namespace {

class NullBackend final : public HostBackend {
 public:
  const char* name() const override { return "null"; }
  size_t page_size() const override { return 4096; }
  bool can_lock() const override { return true; }
  bool holds_bytes() const override { return false; }
  int reserve(size_t size, void** addr) override {
    // Addresses from a private counter, far from anything mapped, never touched.
    const uintptr_t base = next_.fetch_add(size + (1ull << 30));
    *addr = reinterpret_cast<void*>(base);
    return 0;
  }
  int release(void*, size_t) override { return 0; }
  int commit(void*, size_t) override { return 0; }
  int decommit(void*, size_t) override { return 0; }
  int lock(void*, size_t) override { return 0; }
  int unlock(void*, size_t) override { return 0; }

 private:
  std::atomic<uintptr_t> next_{uintptr_t{1} << 46};
};

}  // namespace

std::unique_ptr<HostBackend> make_null_backend() { return std::make_unique<NullBackend>(); }

}  // namespace pins
