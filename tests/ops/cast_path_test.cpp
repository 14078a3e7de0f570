// Note [Chunked fill] (ops/cast_path.h): the chunk loop of a miss to a device,
// run here into a CPU tensor (a device's transfers are the same copy_, queued
// without waiting): every chunk size, whole elements only, the partial last
// chunk, the pin and the staged result both hold the source's bytes.
#include "ops/cast_path.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace pins::ops {
namespace {

TEST(ChunkedFill, PinAndResultHoldTheSourcesBytesForEveryChunkSize) {
  for (const auto dtype : {at::kHalf, at::kFloat, at::kDouble, at::kByte}) {
    for (const int64_t numel : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{4099}}) {
      at::manual_seed(numel);
      const at::Tensor source = (at::randn({numel}) * 50).to(dtype).reshape({-1, 1});
      const int64_t bytes = numel * source.element_size();
      // A chunk of one element, less than one (rounded up to one), odd, exact, larger than the source.
      for (const int64_t chunk : {int64_t{1}, source.element_size() * 3 + 1, int64_t{1000}, bytes, 4 * bytes}) {
        at::Tensor pin = at::zeros_like(source, at::MemoryFormat::Contiguous);
        at::Tensor staged = at::zeros_like(source, at::MemoryFormat::Contiguous);
        fill_in_chunks(pin, source, staged, /*non_blocking=*/false, chunk);
        EXPECT_TRUE(at::equal(pin, source)) << "dtype " << dtype << " numel " << numel << " chunk " << chunk;
        EXPECT_TRUE(at::equal(staged, source)) << "dtype " << dtype << " numel " << numel << " chunk " << chunk;
      }
    }
  }
}

}  // namespace
}  // namespace pins::ops
