// The ops through the dispatcher, as a C++ app calls them (include/pins/ops.h):
// every op is registered once, every C++ entry point is typed with its schema's
// C++ types and reaches its kernel, and bad values are c10::ValueError (Note
// [Error types], ops/library.cpp).
#include <pins/ops.h>

#include "ops/out_tag.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <chrono>
#include <vector>

namespace {

const c10::Device kCpu(c10::kCPU);

int64_t stat(const std::string& key) {
  return pins::ops::stats().at(key);
}

bool has_stat(const std::string& key) {
  return pins::ops::stats().contains(key);
}

std::string model_key(int64_t m, const std::string& rest) {
  return "model." + std::to_string(m) + "." + rest;
}

// Every op of the pins namespace, with its overloads ("" is the default).
const std::set<std::string> kOps = {
    "register_model",
    "forget_model",
    "set_active",
    "set_device_bytes",
    "mark_prompt",
    "end_prompt",
    "end_node",
    "cast_to_device",
    "cast_to_device.out",
    "cast_many_to_device",
    "invalidate",
    "invalidate_model",
    "load_file",
    "free_pins",
    "stats",
    "summary",
    "locked_bytes",
    "configure",
    "config",
    "config_sources",
};

TEST(PinsOps, EveryOpIsRegisteredOnce) {
  std::set<std::string> found;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("pins::", 0) != 0) continue;
    const std::string op = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    EXPECT_TRUE(found.insert(op).second) << op;
  }
  EXPECT_EQ(found, kOps) << "an op was added or removed: update kOps, include/pins/ops.h and these tests";
}

TEST(PinsOps, EveryEntryPointHasItsSchemasCppTypes) {
  // The entry points cache these handles; typed<>() throws when the declared
  // C++ signature differs from the registered kernel's.
  const auto handle = [](const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); };
  EXPECT_NO_THROW(handle("pins::register_model").typed<decltype(pins::ops::register_model)>());
  EXPECT_NO_THROW(handle("pins::forget_model").typed<decltype(pins::ops::forget_model)>());
  EXPECT_NO_THROW(handle("pins::set_active").typed<decltype(pins::ops::set_active)>());
  EXPECT_NO_THROW(handle("pins::set_device_bytes").typed<decltype(pins::ops::set_device_bytes)>());
  EXPECT_NO_THROW(handle("pins::mark_prompt").typed<decltype(pins::ops::mark_prompt)>());
  EXPECT_NO_THROW(handle("pins::end_prompt").typed<decltype(pins::ops::end_prompt)>());
  EXPECT_NO_THROW(handle("pins::end_node").typed<decltype(pins::ops::end_node)>());
  EXPECT_NO_THROW(handle("pins::cast_to_device").typed<decltype(pins::ops::cast_to_device)>());
  EXPECT_NO_THROW(c10::Dispatcher::singleton()
                      .findSchemaOrThrow("pins::cast_to_device", "out")
                      .typed<decltype(pins::ops::cast_to_device_outf)>());
  EXPECT_NO_THROW(handle("pins::cast_many_to_device").typed<decltype(pins::ops::cast_many_to_device)>());
  EXPECT_NO_THROW(handle("pins::invalidate").typed<decltype(pins::ops::invalidate)>());
  EXPECT_NO_THROW(handle("pins::invalidate_model").typed<decltype(pins::ops::invalidate_model)>());
  EXPECT_NO_THROW(handle("pins::load_file").typed<decltype(pins::ops::load_file)>());
  EXPECT_NO_THROW(handle("pins::summary").typed<decltype(pins::ops::summary)>());
  EXPECT_NO_THROW(handle("pins::free_pins").typed<decltype(pins::ops::free_pins)>());
  EXPECT_NO_THROW(handle("pins::stats").typed<decltype(pins::ops::stats)>());
  EXPECT_NO_THROW(handle("pins::locked_bytes").typed<decltype(pins::ops::locked_bytes)>());
  EXPECT_NO_THROW(handle("pins::configure").typed<decltype(pins::ops::configure)>());
  EXPECT_NO_THROW(handle("pins::config").typed<decltype(pins::ops::config)>());
  EXPECT_NO_THROW(handle("pins::config_sources").typed<decltype(pins::ops::config_sources)>());
  // The schema's defaults are the header's defaults.
  const c10::FunctionSchema& cast = handle("pins::cast_to_device").schema();
  ASSERT_EQ(cast.arguments().size(), 8u);
  EXPECT_EQ(cast.arguments()[5].name(), "kind");
  EXPECT_EQ(cast.arguments()[5].default_value()->toStringRef(), "weights");
  EXPECT_EQ(cast.arguments()[4].default_value()->toInt(), -1);
  EXPECT_FALSE(handle("pins::free_pins").schema().arguments()[1].default_value()->toBool());
  EXPECT_FALSE(handle("pins::register_model").schema().arguments()[2].default_value()->toBool());
  EXPECT_EQ(handle("pins::register_model").schema().arguments()[3].default_value()->toInt(), 0);
  const c10::FunctionSchema& out =
      c10::Dispatcher::singleton().findSchemaOrThrow("pins::cast_to_device", "out").schema();
  ASSERT_EQ(out.arguments().size(), 9u);
  EXPECT_TRUE(out.arguments()[8].kwarg_only());
  EXPECT_TRUE(out.arguments()[8].alias_info() && out.arguments()[8].alias_info()->isWrite());
  // Tag::out where the torch release has it, Tag::out_variant before (ops/cast_to_device.cpp).
  EXPECT_TRUE(c10::Dispatcher::singleton().findSchemaOrThrow("pins::cast_to_device", "out").hasTag(pins::ops::out_tag()));
}

TEST(PinsOps, RegisterSetActiveAndForgetReachTheirKernels) {
  const int64_t models = stat("models");
  const int64_t m = pins::ops::register_model("dispatcher-models", kCpu);
  EXPECT_EQ(stat("models"), models + 1);
  EXPECT_EQ(stat(model_key(m, "active")), 0);
  pins::ops::set_active(m, true);
  EXPECT_EQ(stat(model_key(m, "active")), 1);
  pins::ops::set_active(m, false);
  EXPECT_EQ(stat(model_key(m, "active")), 0);
  pins::ops::forget_model(m);
  EXPECT_EQ(stat("models"), models);
  EXPECT_FALSE(has_stat(model_key(m, "active")));
  EXPECT_THROW(pins::ops::forget_model(m), c10::ValueError);
}

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
  EXPECT_EQ(stat(model_key(m, "weights.pins")), 1);
  // All defaults: a plain copy, no pin.
  EXPECT_TRUE(pins::ops::cast_to_device(w, kCpu).equal(w));
  EXPECT_EQ(stat("misses"), misses + 1);
  pins::ops::forget_model(m);
}

TEST(PinsOps, PromptResidentAndFree) {
  const int64_t m = pins::ops::register_model("dispatcher-test-2", kCpu);
  pins::ops::mark_prompt({m});
  pins::ops::set_active(m, true);
  const at::Tensor w = at::randn({1024});
  pins::ops::cast_to_device(w, kCpu, std::nullopt, false, m, "weights", /*resident=*/true);
  EXPECT_EQ(stat(model_key(m, "weights-loaded.pins")), 1);
  EXPECT_EQ(stat(model_key(m, "in_prompt")), 1);
  pins::ops::end_prompt();
  EXPECT_EQ(stat(model_key(m, "in_prompt")), 0);
  pins::ops::set_active(m, false);
  // What stays on the device, as the application says (Note [Spared layers on the device]).
  EXPECT_EQ(stat(model_key(m, "device_bytes")), -1);
  pins::ops::set_device_bytes(m, 4096, 1 << 20);
  EXPECT_EQ(stat(model_key(m, "device_bytes")), 4096);
  pins::ops::set_device_bytes(m, 2 << 20, 1 << 20);
  EXPECT_EQ(stat(model_key(m, "device_bytes")), 1 << 20) << "more than the total counts as the total";
  const int64_t pinned = stat("pinned_bytes");
  EXPECT_EQ(pins::ops::free_pins(1), 4096);
  EXPECT_EQ(stat("pinned_bytes"), pinned - 4096);
  EXPECT_EQ(pins::ops::free_pins(0), 0);
  pins::ops::forget_model(m);
}

TEST(PinsOps, MarkPromptTakesAVector) {
  const int64_t a = pins::ops::register_model("dispatcher-prompt-a", kCpu);
  const int64_t b = pins::ops::register_model("dispatcher-prompt-b", kCpu);
  const std::vector<int64_t> both = {a, b};
  pins::ops::mark_prompt(both);
  EXPECT_EQ(stat(model_key(a, "in_prompt")), 1);
  EXPECT_EQ(stat(model_key(b, "in_prompt")), 1);
  pins::ops::end_prompt();
  EXPECT_EQ(stat(model_key(a, "in_prompt")), 0);
  pins::ops::forget_model(a);
  pins::ops::forget_model(b);
}

// Note [Prewarm]: a model registered with its size and marked in the prompt
// wakes the prewarm, which commits pool memory for it; its first pins take it.
TEST(PinsOps, MarkPromptWakesThePrewarmForARegisteredSize) {
  const std::string saved = pins::ops::config();
  pins::ops::configure("headroom:0,pin_reserve:0");  // whatever RAM this machine has available
  pins::ops::free_pins(int64_t{1} << 40, true);       // no pins, no idle memory left by earlier tests
  const int64_t size = 8 << 20;
  const int64_t m = pins::ops::register_model("dispatcher-prewarm", kCpu, false, size);
  EXPECT_EQ(stat(model_key(m, "size")), size);
  EXPECT_EQ(stat("prewarm"), 1) << "on by default";
  const int64_t before = stat("prewarm_bytes");
  const std::vector<int64_t> models = {m};
  pins::ops::mark_prompt(models);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((stat("prewarm_busy") != 0 || stat("prewarm_bytes") == before) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(stat("prewarm_bytes") - before, size);
  EXPECT_EQ(stat("prewarmed_bytes"), size);
  EXPECT_EQ(stat("prewarm_errors"), 0);
  const int64_t served = stat("prewarm_served_bytes");
  const at::Tensor w = at::randn({1 << 20});  // 4 MiB: its pin takes half
  (void)pins::ops::cast_to_device(w, kCpu, at::kFloat, false, m, "weights", false);
  EXPECT_EQ(stat("prewarm_served_bytes") - served, size / 2);
  EXPECT_EQ(stat("prewarmed_bytes"), size / 2);
  pins::ops::end_prompt();
  EXPECT_THROW(pins::ops::register_model("dispatcher-prewarm", kCpu, false, -1), c10::ValueError);
  pins::ops::forget_model(m);
  pins::ops::configure(saved);
}

TEST(PinsOps, ConfigureReachesItsKernel) {
  const int64_t m = pins::ops::register_model("dispatcher-configure", kCpu);
  const std::string conf = "fast_disk:true";  // a std::string converts to the schema's c10::string_view
  pins::ops::configure(conf);
  // fast_disk: no new pins in the -loaded subsets, so a resident cast streams.
  pins::ops::cast_to_device(at::randn({256}), kCpu, std::nullopt, false, m, "weights", /*resident=*/true);
  EXPECT_EQ(stat(model_key(m, "weights-loaded.pins")), 0);
  EXPECT_EQ(stat(model_key(m, "weights.pins")), 1);
  EXPECT_NE(pins::ops::config().find("fast_disk:true"), std::string::npos) << pins::ops::config();
  pins::ops::configure("fast_disk:false");
  EXPECT_NE(pins::ops::config().find("fast_disk:false"), std::string::npos) << pins::ops::config();
  pins::ops::cast_to_device(at::randn({256}), kCpu, std::nullopt, false, m, "weights", /*resident=*/true);
  EXPECT_EQ(stat(model_key(m, "weights-loaded.pins")), 1);
  pins::ops::forget_model(m);
}

TEST(PinsOps, ConfigReadsBackThroughConfigure) {
  const std::string before = pins::ops::config();
  pins::ops::configure(before);  // every key, pool keys unchanged: accepted
  EXPECT_EQ(pins::ops::config(), before);
  EXPECT_NE(before.find("policy:"), std::string::npos) << before;
  EXPECT_NE(before.find("headroom:"), std::string::npos) << before;
}

// The keys of "key:value,..." in order.
std::vector<std::string> keys_of(const std::string& text) {
  std::vector<std::string> keys;
  for (size_t start = 0; start < text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string entry = text.substr(start, comma - start);
    keys.push_back(entry.substr(0, entry.find(':')));
    start = comma + 1;
  }
  return keys;
}

// Every key of config() has its source (Note [Derived budget] for headroom and
// pin_reserve), and a configure() names itself as the source of what it set.
TEST(PinsOps, ConfigSourcesSayWhereEachSettingCameFrom) {
  const std::string sources = pins::ops::config_sources();
  EXPECT_EQ(keys_of(sources), keys_of(pins::ops::config())) << sources;
  for (size_t start = 0; start < sources.size();) {
    const size_t comma = std::min(sources.find(',', start), sources.size());
    const std::string entry = sources.substr(start, comma - start);
    const std::string source = entry.substr(entry.find(':') + 1);
    EXPECT_TRUE(source == "default" || source == "PINS_CONF" || source == "configure()" ||
                source.rfind("derived from the machine: ", 0) == 0)
        << entry;
    start = comma + 1;
  }
  pins::ops::configure("policy:mru");
  EXPECT_NE(pins::ops::config_sources().find("policy:configure()"), std::string::npos) << pins::ops::config_sources();
}

TEST(PinsOps, ErrorsNameTheArgument) {
  const at::Tensor w = at::randn({4});
  try {
    pins::ops::cast_to_device(w, kCpu, std::nullopt, false, 424242);
    FAIL() << "no error for an unknown model";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("model 424242 is not registered"), std::string::npos) << e.what();
  }
  try {
    pins::ops::configure("nope:1");
    FAIL() << "no error for an unknown key";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'nope'"), std::string::npos) << e.what();
  }
}

TEST(PinsOps, InferenceTensorsArePinnedAndHit) {
  const int64_t m = pins::ops::register_model("dispatcher-inference", kCpu);
  at::Tensor w;
  {
    c10::InferenceMode guard;
    w = at::randn({256});
  }
  const int64_t hits = stat("hits"), misses = stat("misses");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(pins::ops::cast_to_device(w, kCpu, std::nullopt, false, m).equal(w));
  EXPECT_EQ(stat("misses"), misses + 1);
  EXPECT_EQ(stat("hits"), hits + 2);
  EXPECT_EQ(pins::ops::invalidate(w), 256 * 4);
  EXPECT_EQ(stat(model_key(m, "invalidated")), 1);
  EXPECT_EQ(pins::ops::invalidate(w), 0);
  pins::ops::forget_model(m);
}

TEST(PinsOps, CastManyServesAGroupFromOnePin) {
  const int64_t m = pins::ops::register_model("dispatcher-many", kCpu);
  const at::Tensor w = at::randn({32, 16}).to(at::kHalf), b = at::randn({32});
  const int64_t hits = stat("hits"), misses = stat("misses"), pinned = stat("pins");
  for (int i = 0; i < 2; ++i) {
    const std::vector<at::Tensor> out = pins::ops::cast_many_to_device({w, b}, kCpu, at::kFloat, false, m);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(out[0].equal(w.to(at::kFloat)));
    EXPECT_TRUE(out[1].equal(b));
  }
  EXPECT_EQ(stat("misses"), misses + 1);
  EXPECT_EQ(stat("hits"), hits + 1);
  EXPECT_EQ(stat("pins"), pinned + 1);
  EXPECT_EQ(pins::ops::invalidate(b), 32 * 16 * 2 + 32 * 4)
      << "any part drops the group: weight, then the bias at 1024";
  EXPECT_EQ(pins::ops::cast_many_to_device({}, kCpu).size(), 0u);
  pins::ops::forget_model(m);
}

TEST(PinsOps, CastIntoTheCallersBuffer) {
  const int64_t m = pins::ops::register_model("dispatcher-out", kCpu);
  const at::Tensor w = at::randn({64, 8});
  at::Tensor buf = at::empty({64, 8}, at::kBFloat16);
  const int64_t hits = stat("hits");
  at::Tensor& a = pins::ops::cast_to_device_out(buf, w, kCpu, at::kBFloat16, false, m);
  EXPECT_TRUE(a.is_same(buf));
  EXPECT_TRUE(buf.equal(w.to(at::kBFloat16)));
  buf.zero_();
  at::Tensor& b = pins::ops::cast_to_device_outf(w, kCpu, at::kBFloat16, false, m, "weights", false, std::nullopt, buf);
  EXPECT_TRUE(b.is_same(buf));
  EXPECT_TRUE(buf.equal(w.to(at::kBFloat16)));
  EXPECT_EQ(stat("hits"), hits + 1);
  at::Tensor wrong = at::empty({64, 8});
  EXPECT_THROW(pins::ops::cast_to_device_out(wrong, w, kCpu, at::kBFloat16, false, m), c10::ValueError);
  pins::ops::forget_model(m);
}

TEST(PinsOps, NodeBoundaryInvalidateModelAndFastDisk) {
  const int64_t m = pins::ops::register_model("dispatcher-node", kCpu, /*fast_disk=*/true);
  EXPECT_EQ(stat(model_key(m, "fast_disk")), 1);
  pins::ops::mark_prompt({m});
  pins::ops::set_active(m, true);
  const at::Tensor p = at::randn({64}), w = at::randn({64});
  pins::ops::cast_to_device(p, kCpu, std::nullopt, false, m, "patches");
  pins::ops::cast_to_device(w, kCpu, std::nullopt, false, m, "weights", /*resident=*/true);
  EXPECT_EQ(stat(model_key(m, "weights-loaded.pins")), 0) << "a fast_disk model gets no -loaded pins";
  EXPECT_EQ(stat(model_key(m, "weights.pins")), 1);
  pins::ops::end_node();
  EXPECT_EQ(stat(model_key(m, "patches.pins")), 0);
  EXPECT_EQ(stat(model_key(m, "active")), 0);
  EXPECT_EQ(stat(model_key(m, "in_prompt")), 1);
  EXPECT_EQ(stat("prompt"), 1);
  EXPECT_EQ(pins::ops::invalidate_model(m), 64 * 4);
  EXPECT_EQ(stat(model_key(m, "pins")), 0);
  pins::ops::end_prompt();
  pins::ops::forget_model(m);
}

// A safetensors file written by hand (Note [Safetensors layout]): load_file's
// tensors through the dispatcher, and a new pin of one filled from the file.
TEST(PinsOps, LoadFileAndAPinFilledFromTheFile) {
  const std::string path = ::testing::TempDir() + "pins_ops_load_file.safetensors";
  const std::string json = R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]},)"
                           R"("a":{"dtype":"I16","shape":[2,2],"data_offsets":[0,8]}})";
  {
    std::ofstream f(path, std::ios::binary);
    const uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
    f << json;
    const int16_t a[4] = {1, -2, 3, -4};
    const float b[3] = {0.5f, -1.25f, 3.0f};
    f.write(reinterpret_cast<const char*>(a), sizeof a).write(reinterpret_cast<const char*>(b), sizeof b);
  }
  const c10::Dict<std::string, at::Tensor> d = pins::ops::load_file(path);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d.begin()->key(), "a");  // in the order of their bytes
  EXPECT_TRUE(at::equal(d.at("a"), at::tensor({1, -2, 3, -4}, at::kShort).view({2, 2})));
  const at::Tensor b = d.at("b");
  EXPECT_TRUE(at::equal(b, at::tensor({0.5f, -1.25f, 3.0f})));
  const int64_t m = pins::ops::register_model("load-file", at::Device(at::kCPU));
  const int64_t fills = pins::ops::stats().at("file_fills");
  EXPECT_TRUE(at::equal(pins::ops::cast_to_device(b, at::Device(at::kCPU), at::kDouble, false, m),
                        at::tensor({0.5, -1.25, 3.0}, at::kDouble)));
  EXPECT_EQ(pins::ops::stats().at("file_fills"), fills + 1);
  pins::ops::forget_model(m);
  EXPECT_THROW(pins::ops::load_file(path + ".missing"), c10::Error);
  std::remove(path.c_str());
}

TEST(PinsOps, StatsByNameBypassesAndSummary) {
  const int64_t m = pins::ops::register_model("dispatcher-named", kCpu);
  const int64_t empty = stat("bypassed.empty"), plain = stat("plain_copies");
  pins::ops::cast_to_device(at::empty({0}), kCpu, std::nullopt, false, m);
  pins::ops::cast_to_device(at::randn({4}), kCpu);
  EXPECT_EQ(stat("bypassed.empty"), empty + 1);
  EXPECT_EQ(stat("model.dispatcher-named.bypassed.empty"), 1);
  EXPECT_EQ(stat("model.dispatcher-named.id"), m);
  EXPECT_EQ(stat(model_key(m, "bypassed")), 1);
  EXPECT_EQ(stat("plain_copies"), plain + 1);
  const std::string text = pins::ops::summary();
  EXPECT_NE(text.find("'dispatcher-named' (cpu): 0 pins"), std::string::npos) << text;
  EXPECT_NE(text.find("1 bypassed (empty 1)"), std::string::npos) << text;
  pins::ops::forget_model(m);
  EXPECT_FALSE(has_stat("model.dispatcher-named.id"));
}

TEST(PinsOps, BadValuesAreValueErrors) {
  const int64_t m = pins::ops::register_model("dispatcher-errors", kCpu);
  const std::vector<std::pair<const char*, std::function<void()>>> bad = {
      {"meta source", [&] { pins::ops::cast_to_device(at::empty({4}, at::kMeta), kCpu, std::nullopt, false, m); }},
      {"sparse source", [&] { pins::ops::cast_to_device(at::eye(3).to_sparse(), kCpu, std::nullopt, false, m); }},
      {"quantized source",
       [&] {
         pins::ops::cast_to_device(at::quantize_per_tensor(at::randn({4}), 0.1, 0, at::kQInt8), kCpu, std::nullopt,
                                   false, m);
       }},
      {"undefined source", [&] { pins::ops::cast_to_device(at::Tensor(), kCpu); }},
      {"kind", [&] { pins::ops::cast_to_device(at::randn({4}), kCpu, std::nullopt, false, -1, "bias"); }},
      {"undefined part",
       [&] {
         pins::ops::cast_many_to_device({at::randn({4}), at::Tensor()}, kCpu);
       }},
      {"meta part", [&] { pins::ops::cast_many_to_device({at::empty({4}, at::kMeta)}, kCpu, std::nullopt, false, m); }},
      {"unknown model (cast_many)",
       [&] { pins::ops::cast_many_to_device({at::randn({4})}, kCpu, std::nullopt, false, 424242); }},
      {"kind (cast_many)",
       [&] { pins::ops::cast_many_to_device({at::randn({4})}, kCpu, std::nullopt, false, m, "bias"); }},
      {"out of another shape",
       [&] {
         at::Tensor out = at::empty({5});
         pins::ops::cast_to_device_out(out, at::randn({4}), kCpu, std::nullopt, false, m);
       }},
      {"out of another dtype",
       [&] {
         at::Tensor out = at::empty({4}, at::kHalf);
         pins::ops::cast_to_device_out(out, at::randn({4}), kCpu);
       }},
      {"undefined out",
       [&] {
         at::Tensor out;
         pins::ops::cast_to_device_out(out, at::randn({4}), kCpu);
       }},
      {"meta source (invalidate)", [] { pins::ops::invalidate(at::empty({4}, at::kMeta)); }},
      {"undefined source (invalidate)", [] { pins::ops::invalidate(at::Tensor()); }},
      {"unknown model (invalidate_model)", [] { pins::ops::invalidate_model(424242); }},
      {"model -7", [&] { pins::ops::cast_to_device(at::randn({4}), kCpu, std::nullopt, false, -7); }},
      {"unknown model (cast)", [&] { pins::ops::cast_to_device(at::randn({4}), kCpu, std::nullopt, false, 424242); }},
      {"unknown model (forget)", [] { pins::ops::forget_model(424242); }},
      {"unknown model (set_active)", [] { pins::ops::set_active(424242, true); }},
      {"unknown model (set_device_bytes)", [] { pins::ops::set_device_bytes(424242, 0, 0); }},
      {"negative device bytes", [&] { pins::ops::set_device_bytes(m, -1, 0); }},
      {"negative total", [&] { pins::ops::set_device_bytes(m, 0, -1); }},
      {"unknown model (mark_prompt)", [] { pins::ops::mark_prompt({424242}); }},
      {"empty name", [] { pins::ops::register_model("", kCpu); }},
      {"negative bytes", [] { pins::ops::free_pins(-1); }},
      {"unknown key", [] { pins::ops::configure("nope:1"); }},
      {"bad value", [] { pins::ops::configure("policy:fifo"); }},
      {"pool key after the pool exists", [] { pins::ops::configure("segment_size:2G"); }},
  };
  for (const auto& [what, call] : bad) EXPECT_THROW(call(), c10::ValueError) << what;
  EXPECT_EQ(stat(model_key(m, "in_prompt")), 0);
  pins::ops::forget_model(m);
}

}  // namespace
