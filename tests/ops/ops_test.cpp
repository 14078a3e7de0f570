// The ops through the dispatcher, as a C++ app calls them (include/pins/ops.h).
#include <pins/ops.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

const c10::Device kCpu(c10::kCPU);

int64_t stat(const std::string& key) { return pins::ops::stats().at(key); }

TEST(PinsOps, CastThroughTheDispatcherMissesThenHits) {
  const int64_t m = pins::ops::register_model("dispatcher-test", kCpu);
  const at::Tensor w = at::randn({128, 64});
  const int64_t hits = stat("hits"), misses = stat("misses");
  const at::Tensor a = pins::ops::cast_to_device(w, kCpu, at::kBFloat16, false, m);
  const at::Tensor b = pins::ops::cast_to_device(w, kCpu, at::kBFloat16, false, m);
  EXPECT_TRUE(a.equal(w.to(at::kBFloat16)));
  EXPECT_TRUE(b.equal(a));
  EXPECT_EQ(stat("misses"), misses + 1);
  EXPECT_EQ(stat("hits"), hits + 1);
  EXPECT_EQ(stat("model." + std::to_string(m) + ".weights.pins"), 1);
  pins::ops::forget_model(m);
}

TEST(PinsOps, PromptResidentAndFree) {
  const int64_t m = pins::ops::register_model("dispatcher-test-2", kCpu);
  pins::ops::mark_prompt({m});
  pins::ops::set_active(m, true);
  const at::Tensor w = at::randn({1024});
  pins::ops::cast_to_device(w, kCpu, std::nullopt, false, m, "weights", /*resident=*/true);
  EXPECT_EQ(stat("model." + std::to_string(m) + ".weights-loaded.pins"), 1);
  EXPECT_EQ(stat("model." + std::to_string(m) + ".in_prompt"), 1);
  pins::ops::end_prompt();
  EXPECT_EQ(stat("model." + std::to_string(m) + ".in_prompt"), 0);
  pins::ops::set_active(m, false);
  EXPECT_EQ(pins::ops::free_pins(1), 4096);
  pins::ops::forget_model(m);
}

TEST(PinsOps, ErrorsNameTheArgument) {
  const at::Tensor w = at::randn({4});
  try {
    pins::ops::cast_to_device(w, kCpu, std::nullopt, false, 424242);
    FAIL() << "no error for an unknown model";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model 424242 is not registered"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pins::ops::free_pins(-1), c10::Error);
  EXPECT_THROW(pins::ops::configure("nope:1"), c10::Error);
  EXPECT_THROW(pins::ops::cast_to_device(w, kCpu, std::nullopt, false, -1, "bias"), c10::Error);
}

}  // namespace
