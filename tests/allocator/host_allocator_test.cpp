#include "allocator/host_allocator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "csrc/base/check.h"
#include "csrc/runtime/runtime.h"

namespace pins {
namespace {

// The pool the allocator serves from: the process-wide Runtime's.
HostPool& pool() { return Runtime::get().pool(); }

TEST(TorchHostAllocator, PinIsAnOrdinaryCpuTensorBackedByThePool) {
  const int64_t before = pool().stats().blocks.current;
  {
    at::Tensor t = try_empty_pinned({64, 33}, at::kHalf);
    ASSERT_TRUE(t.defined());
    EXPECT_EQ(t.device(), c10::Device(c10::kCPU));
    EXPECT_EQ(t.numel(), 64 * 33);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.storage().allocator(), &torch_host_allocator());
    EXPECT_EQ(pool().requested_size(t.data_ptr()), 64u * 33u * 2u);
    EXPECT_EQ(pool().stats().blocks.current, before + 1);
    t.fill_(1.5);
    EXPECT_EQ(t.sum().item<float>(), 1.5f * 64 * 33);
  }
  EXPECT_EQ(pool().stats().blocks.current, before) << "dropping the tensor did not free its block";
  pool().check_invariants();
}

TEST(TorchHostAllocator, AllocateRawDeleterAndCopyData) {
  TorchHostAllocator& a = torch_host_allocator();
  void* p = a.raw_allocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(pool().requested_size(p), 1000u);
  std::vector<char> src(1000, 7);
  a.copy_data(p, src.data(), src.size());
  EXPECT_EQ(static_cast<char*>(p)[999], 7);
  a.raw_deallocate(p);
  EXPECT_THROW(pool().requested_size(p), ValueError);
  c10::DataPtr empty = a.allocate(0);
  EXPECT_EQ(empty.get(), nullptr);
  // A storage through the allocator, as torch's own factory functions would build it.
  at::Tensor t = at::empty({10}, at::TensorOptions().dtype(at::kFloat));
  auto st = c10::Storage(c10::Storage::use_byte_size_t(), 40, &a, /*resizable=*/false);
  t.set_(st);
  t.copy_(at::arange(10, at::kFloat));
  EXPECT_EQ(t[9].item<float>(), 9.0f);
  EXPECT_EQ(pool().requested_size(t.data_ptr()), 40u);
  pool().check_invariants();
}

TEST(TorchHostAllocator, PinnedOnCudaMachines) {
  if (std::string(pool().stats().backend) != "cuda")
    GTEST_SKIP() << "pool backend is " << pool().stats().backend << ": is_pinned() needs the cuda backend";
  at::Tensor t = try_empty_pinned({1024}, at::kFloat);
  EXPECT_TRUE(t.is_pinned());
}

}  // namespace
}  // namespace pins
