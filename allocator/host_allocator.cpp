#include "allocator/host_allocator.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/StorageImpl.h>

#include <cstring>

#include "csrc/base/check.h"
#include "csrc/runtime/runtime.h"

namespace pins {
namespace {

// The pool of the process-wide Runtime, which is never destroyed: a tensor
// freed during static destruction still finds it. A block exists only once
// torch_pool() admitted the pool.
void delete_block(void* ptr) {
  if (ptr != nullptr) Runtime::get().pool().free(ptr);
}

// The event of the copy's stream, on its device type. Under torch's ROCm build
// an AMD GPU is DeviceType::CUDA too (torch's Note [Masquerading as CUDA]), so
// this is a hipEvent there and the hip backend needs nothing of its own here.
class EventFence final : public Fence {
 public:
  explicit EventFence(c10::Stream stream) : event_(stream.device_type()) { event_.record(stream); }
  bool done() override { return event_.query(); }

 private:
  c10::Event event_;
};

c10::DataPtr wrap(void* p) {
  return {p, p, &delete_block, c10::Device(c10::DeviceType::CPU)};
}

}  // namespace

HostPool& torch_pool() {
  HostPool* pool = nullptr;
  try {
    pool = &Runtime::get().pool();
  } catch (const ValueError& e) {
    TORCH_CHECK_VALUE(false, e.what());  // a bad PINS_CONF (Note [Error types] in ops/library.cpp)
  }
  TORCH_CHECK_VALUE(pool->backend().holds_bytes(), "PINS_CONF key 'backend' is '", pool->stats().backend,
                    "', which keeps address bookkeeping only (no memory behind a pin: the simulator's); the torch "
                    "ops need 'cpu', 'cuda', 'hip' or 'auto'");
  return *pool;
}

c10::DataPtr TorchHostAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return wrap(nullptr);
  return wrap(torch_pool().allocate(nbytes));
}

c10::DeleterFnPtr TorchHostAllocator::raw_deleter() const { return &delete_block; }

void TorchHostAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count != 0) std::memcpy(dest, src, count);
}

TorchHostAllocator& torch_host_allocator() {
  static TorchHostAllocator a;
  return a;
}

at::Tensor try_empty_pinned(c10::IntArrayRef sizes, c10::ScalarType dtype, bool lock) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  void* p = nbytes == 0 ? nullptr : torch_pool().try_allocate(nbytes, lock);
  if (nbytes != 0 && p == nullptr) return {};
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, wrap(p),
                                                       &torch_host_allocator(), /*resizable=*/false);
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(c10::kCPU))
      .set_(c10::Storage(std::move(storage)), 0, sizes);
}

void record_stream(const void* data, c10::Stream stream) {
  if (data == nullptr || stream.device_type() == c10::DeviceType::CPU) return;  // CPU work is synchronous
  Runtime::get().pool().record_fence(const_cast<void*>(data), std::make_shared<EventFence>(stream));
}

}  // namespace pins
