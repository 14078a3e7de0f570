// The expansion rule (profiling/sim/expand.h) on small traces whose accesses
// are computed by hand in the comments, in MiB.
#include "profiling/sim/expand.h"

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/config/config.h"

namespace pins::sim {
namespace {

constexpr uint64_t M = 1ull << 20;

// vram 1000, reserve 100. A = [a0 200, a1 100] (inference 0);
// B = [b0 400, b1 300, b2 200, b3 100] (inference 100).
std::string small_trace(const std::string& prompts, const std::string& sequences, const std::string& loras = "[]") {
  return R"({
    "name": "small",
    "machine": {"ram": "8000MiB", "vram": "1000MiB", "disk_read_bw": "1GB/s", "ram_copy_bw": "10GB/s",
                "h2d_bw": "20GB/s", "headroom": "1000MiB", "other_ram": "2000MiB", "vram_reserve": "100MiB"},
    "models": [
      {"name": "A", "layers": [{"name": "a0", "bytes": "200MiB"}, {"name": "a1", "bytes": "100MiB"}]},
      {"name": "B", "inference_bytes": "100MiB", "layers": [{"name": "b0", "bytes": "400MiB"},
        {"name": "b1", "bytes": "300MiB"}, {"name": "b2", "bytes": "200MiB"}, {"name": "b3", "bytes": "100MiB"}]}
    ],
    "loras": )" +
         loras + R"(,
    "prompts": )" +
         prompts + R"(,
    "sequences": )" +
         sequences + "}";
}

struct Seen {
  std::string model, layer;
  uint64_t mib;
  bool resident;
  bool patch;
  bool operator==(const Seen&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << s.model << "/" << s.layer << " " << s.mib << "MiB" << (s.resident ? " resident" : " streamed")
            << (s.patch ? " patch" : "");
}

std::vector<Seen> accesses(const Trace& t, const Expansion& e, int run) {
  std::vector<Seen> out;
  for (const Access& a : e.accesses)
    if (a.run == run)
      out.push_back({t.models[a.model].name, t.models[a.model].layers[a.layer].name, a.bytes / M, a.resident,
                     a.kind == Kind::Patches});
  return out;
}

TEST(SimExpand, WholeModelFitsAndStaysResident) {
  // B alone: 1.1*1000 + (100 + 100) = 1300 to free; nothing else is loaded.
  // F = 1000: budget = max(128, 1000 - 200, min(0.4*1000, 1000 - 100)) = 800 < 1000:
  // largest first while the total stays under 800: b0 (400), b1 (700); b2
  // (900) and b3 (800, not < 800) stream. Copies of b0, b1, then per pass b2, b3.
  const Trace t = parse_trace(
      small_trace(R"([{"name": "p", "steps": [{"model": "B", "steps": 2}]}])", R"([{"name": "s", "prompts": ["p"]}])"),
      "small");
  const Expansion e = expand(t, t.sequences[0], 2);
  const std::vector<Seen> want = {{"B", "b0", 400, true, false},  {"B", "b1", 300, true, false},
                                  {"B", "b2", 200, false, false}, {"B", "b3", 100, false, false},
                                  {"B", "b2", 200, false, false}, {"B", "b3", 100, false, false}};
  EXPECT_EQ(accesses(t, e, 0), want);
  // Run 2: b0 and b1 are still on the device; only the streamed layers move.
  const std::vector<Seen> again = {{"B", "b2", 200, false, false},
                                   {"B", "b3", 100, false, false},
                                   {"B", "b2", 200, false, false},
                                   {"B", "b3", 100, false, false}};
  EXPECT_EQ(accesses(t, e, 1), again);
  const RunBound& b = e.runs[1].bound;
  EXPECT_EQ(b.used, 1000 * M);
  EXPECT_EQ(b.copied, 300 * M);
  EXPECT_EQ(b.kept, 700 * M);
  EXPECT_EQ(b.cold, 0u);
  EXPECT_EQ(b.pin_capacity, 5000 * M);  // 8000 - 2000 other - 1000 headroom
  EXPECT_EQ(b.cache, 5700 * M);
  EXPECT_EQ(b.lower_bound, 0u);
  EXPECT_EQ(b.streamed_bytes, 600 * M);
  EXPECT_EQ(e.runs[0].bound.cold, 1000 * M);
  EXPECT_EQ(e.runs[0].bound.lower_bound, 1000 * M);
}

TEST(SimExpand, OtherModelsUnloadWholeOrSmallestLayersFirst) {
  // Run 1: A fits whole (budget 900 > 300): a0, a1. B: 1.1*1000 + 200 = 1300 to
  // free, 700 free: A must give 600 >= its 300, so it unloads whole; then B as
  // above (b0, b1 resident; b2, b3 stream once).
  // Run 2: A: 1.1*300 + 100 = 430 to free, 300 free: B gives 130 < its 700, smallest
  // layers first until more than 130 is freed: b1 (300) goes, b0 stays. F = 1000 -
  // 400 = 600: budget max(128, 500, min(240, 500)) = 500 > 300: a0, a1 again.
  // B: 1.1*600 + 200 = 860 to free, 300 free: A gives 560 >= 300: unloaded whole.
  // F = 600 + 400 = 1000: budget 800: b0 (kept), b1 copied; b2, b3 stream.
  const Trace t = parse_trace(small_trace(R"([{"name": "p", "steps": [{"model": "A"}, {"model": "B"}]}])",
                                          R"([{"name": "s", "prompts": ["p"]}])"),
                              "small");
  const Expansion e = expand(t, t.sequences[0], 2);
  const std::vector<Seen> run1 = {{"A", "a0", 200, true, false},  {"A", "a1", 100, true, false},
                                  {"B", "b0", 400, true, false},  {"B", "b1", 300, true, false},
                                  {"B", "b2", 200, false, false}, {"B", "b3", 100, false, false}};
  EXPECT_EQ(accesses(t, e, 0), run1);
  const std::vector<Seen> run2 = {{"A", "a0", 200, true, false},
                                  {"A", "a1", 100, true, false},
                                  {"B", "b1", 300, true, false},
                                  {"B", "b2", 200, false, false},
                                  {"B", "b3", 100, false, false}};
  EXPECT_EQ(accesses(t, e, 1), run2);
  const RunBound& b = e.runs[1].bound;
  EXPECT_EQ(b.used, 1300 * M);
  EXPECT_EQ(b.kept, 400 * M);  // b0 never left the device
  EXPECT_EQ(b.copied, 900 * M);
  EXPECT_EQ(e.runs[1].steps[0].vram_used_after, 700 * M);  // a0 a1 b0
  EXPECT_EQ(e.runs[1].steps[1].vram_used_after, 700 * M);  // b0 b1
  // Each model's bytes on the device after each step (what pins.set_device_bytes says).
  const std::vector<std::vector<uint64_t>> device = {{300 * M, 0}, {0, 700 * M}, {300 * M, 400 * M}, {0, 700 * M}};
  for (size_t i = 0; i < device.size(); ++i) EXPECT_EQ(e.runs[i / 2].steps[i % 2].device_after, device[i]) << i;
}

TEST(SimExpand, CachedEncoderOutputSkipsTheModel) {
  // Prompt "again" runs B only (like a seed change): nothing of A is copied.
  const Trace t = parse_trace(small_trace(R"([{"name": "p", "steps": [{"model": "A"}, {"model": "B"}]},
                                              {"name": "again", "steps": [{"model": "B"}]}])",
                                          R"([{"name": "s", "prompts": ["p", "again"], "repeat_from": 1}])"),
                              "small");
  EXPECT_EQ(t.sequences[0].prompt_at(0), 0);
  EXPECT_EQ(t.sequences[0].prompt_at(1), 1);
  EXPECT_EQ(t.sequences[0].prompt_at(5), 1);
  const Expansion e = expand(t, t.sequences[0], 3);
  for (int run : {1, 2})
    for (const Seen& s : accesses(t, e, run)) EXPECT_EQ(s.model, "B") << s;
  // Run 2 starts with b0 b1 on the device (B ran last): b2, b3 stream.
  const std::vector<Seen> run2 = {{"B", "b2", 200, false, false}, {"B", "b3", 100, false, false}};
  EXPECT_EQ(accesses(t, e, 1), run2);
  EXPECT_EQ(e.runs[1].bound.used, 1000 * M);
}

TEST(SimExpand, LoraPatchesFollowTheirWeightsAndASwapReloads) {
  // style: 100 MiB over b0 (400) and b2 (200) in proportion: 69905066 and
  // 34952533 bytes, the rounding remainder (1) to the last patched layer.
  const std::string loras = R"([{"name": "style", "model": "B", "bytes": "100MiB", "targets": ["b0", "b2"]}])";
  const Trace t = parse_trace(small_trace(R"([{"name": "with", "steps": [{"model": "B", "loras": ["style"]}]},
                                              {"name": "without", "steps": [{"model": "B"}]}])",
                                          R"([{"name": "s", "prompts": ["with", "without"]}])", loras),
                              "small");
  ASSERT_EQ(t.loras[0].layer_bytes, (std::vector<uint64_t>{69905066, 0, 34952534, 0}));
  const Expansion e = expand(t, t.sequences[0], 2);
  std::vector<std::pair<std::string, bool>> run1;
  for (const Access& a : e.accesses)
    if (a.run == 0) run1.emplace_back(key_name(t, a), a.resident);
  const std::vector<std::pair<std::string, bool>> want = {{"B/b0", true},  {"lora:style/B/b0", true},  {"B/b1", true},
                                                          {"B/b2", false}, {"lora:style/B/b2", false}, {"B/b3", false}};
  EXPECT_EQ(run1, want);
  for (const Access& a : e.accesses)
    if (a.kind == Kind::Patches) {
      EXPECT_TRUE(a.signature.has_value());
      EXPECT_EQ(a.subset(), a.resident ? Subset::PatchesLoaded : Subset::Patches);
    }
  // Run 2 has no LoRA: the patched copies on the device are restored, so b0 and
  // b1 are copied again; no patch is.
  const std::vector<Seen> run2 = {{"B", "b0", 400, true, false},
                                  {"B", "b1", 300, true, false},
                                  {"B", "b2", 200, false, false},
                                  {"B", "b3", 100, false, false}};
  EXPECT_EQ(accesses(t, e, 1), run2);
  EXPECT_EQ(e.runs[0].bound.app_ram, 2100 * M) << "the LoRA file is in RAM while its prompt runs";
  EXPECT_EQ(e.runs[1].bound.app_ram, 2000 * M);
}

TEST(SimExpand, LowerBoundCountsColdWeightsAndTheWindow) {
  // ram 2500: P = 2500 - 2000 - 1000 headroom = 0 (saturated): every copied byte is read.
  std::string text =
      small_trace(R"([{"name": "a", "steps": [{"model": "A"}]}, {"name": "b", "steps": [{"model": "B"}]}])",
                  R"([{"name": "ab", "prompts": ["a", "b"]}])");
  text.replace(text.find("8000MiB"), 7, "3300MiB");  // P = 300
  const Trace t = parse_trace(text, "small");
  const Expansion e = expand(t, t.sequences[0], 4);
  EXPECT_EQ(e.runs[0].bound.pin_capacity, 300 * M);
  EXPECT_EQ(e.runs[0].bound.lower_bound, 300 * M);   // cold
  EXPECT_EQ(e.runs[1].bound.lower_bound, 1000 * M);  // cold
  // Run 3 (A again, after B unloaded it): 300 copied, warm, P = 300: bound 0.
  EXPECT_EQ(e.runs[2].bound.cold, 0u);
  EXPECT_EQ(e.runs[2].bound.lower_bound, 0u);
  // Runs 3-4 together copy A (300) and whatever of B is not on the device; the
  // window bound is at least the sum of the runs' bounds.
  const uint64_t w = window_bound(e, 2, 2);
  EXPECT_GE(w, e.runs[2].bound.lower_bound + e.runs[3].bound.lower_bound);
  uint64_t copied = 0;
  for (int r : {2, 3})
    for (const auto& [key, bytes] : e.runs[r].copied_keys) copied += bytes;
  EXPECT_EQ(w, std::max(e.runs[2].bound.lower_bound + e.runs[3].bound.lower_bound, copied - 300 * M));
}

TEST(SimGroup, BlocksSplitAtTheNextNumberWhenTooLarge) {
  const std::vector<model_params::Tensor> ts = {{"conv_in.weight", 10},          {"conv_in.bias", 2},
                                                {"blocks.0.attn.q.weight", 100}, {"blocks.0.attn.q.bias", 4},
                                                {"blocks.0.ffn.0.weight", 200},  {"blocks.0.ffn.2.weight", 200},
                                                {"blocks.1.attn.q.weight", 100}, {"head.head.weight", 8},
                                                {"head.modulation", 3}};
  std::vector<Layer> blocks = group_layers(ts, "block", 2, 0);
  std::vector<std::string> names;
  for (const Layer& l : blocks) names.push_back(l.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv_in", "blocks.0", "blocks.1", "head.head", "head"}));
  EXPECT_EQ(blocks[1].bytes, 1008u);
  // blocks.0 is 1008 bytes: over 600 it splits at the next number (ffn.0, ffn.2).
  blocks = group_layers(ts, "block", 2, 600);
  names.clear();
  for (const Layer& l : blocks) names.push_back(l.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv_in", "blocks.0.attn.q", "blocks.0.ffn.0", "blocks.0.ffn.2",
                                             "blocks.1", "head.head", "head"}));
  EXPECT_EQ(group_layers(ts, "module", 2, 0).size(), 7u);
  EXPECT_EQ(group_layers(ts, "tensor", 2, 0).size(), ts.size());
}

Machine machine_of(const std::string& fields) {
  return parse_trace(R"({"name": "units", "machine": {)" + fields + R"(},
    "models": [{"name": "A", "bytes": 4096, "layer_count": 1}],
    "prompts": [{"name": "p", "steps": [{"model": "A"}]}]})",
                     "units.json")
      .machine;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// Trace sizes follow Note [Size syntax] (csrc/base/size.h), as PINS_CONF does:
// KB decimal, K and KiB binary, fractions allowed; a bandwidth is a size a second.
TEST(SimUnits, TraceSizesAndBandwidthsFollowTheSizeSyntax) {
  const char* fields = R"("ram": "8GB", "vram": "1.5 GiB", "disk_read_bw": "3GB/s", "ram_copy_bw": "1 GiB/s",
                          "h2d_bw": 25e9, "headroom": "512M", "other_ram": "2KB", "vram_reserve": 4096)";
  Machine m = machine_of(fields);
  EXPECT_EQ(m.ram, 8000000000u);
  EXPECT_EQ(m.vram, 3ull << 29);
  EXPECT_DOUBLE_EQ(m.disk_read_bw, 3e9);
  EXPECT_DOUBLE_EQ(m.ram_copy_bw, 1073741824.0);
  EXPECT_DOUBLE_EQ(m.h2d_bw, 25e9);
  EXPECT_EQ(m.headroom, 512ull << 20);
  EXPECT_EQ(m.other_ram, 2000u);
  EXPECT_EQ(m.vram_reserve, 4096u);
  set_machine_field(m, "other_ram=1KiB");
  set_machine_field(m, "swap = 1K");
  set_machine_field(m, "h2d_bw=2.5 GB/s");
  EXPECT_EQ(m.other_ram, 1024u);
  EXPECT_EQ(m.swap, 1024u);
  EXPECT_DOUBLE_EQ(m.h2d_bw, 2.5e9);

  EXPECT_EQ(parse_bandwidth("500MB"), 5e8) << "the /s is optional";
  for (const char* bad : {"0GB/s", "12XB/s", "3GB/h", "-1GB/s", "", "GB/s", "1e9"})
    EXPECT_FALSE(parse_bandwidth(bad).has_value()) << bad;

  // Errors name the file, the field and the value.
  const std::string ram = error_of([&] { machine_of(std::string(fields).replace(7, 5, "\"12XB\"")); });
  EXPECT_NE(ram.find("units.json: machine.ram: expected a size such as"), std::string::npos) << ram;
  EXPECT_NE(ram.find("got \"12XB\""), std::string::npos) << ram;
  const std::string bw = error_of([&] { set_machine_field(m, "disk_read_bw=0GB/s"); });
  EXPECT_NE(bw.find("--machine disk_read_bw: expected a positive bandwidth"), std::string::npos) << bw;
  EXPECT_NE(bw.find("got \"0GB/s\""), std::string::npos) << bw;
  const std::string size = error_of([&] { set_machine_field(m, "ram=lots"); });
  EXPECT_NE(size.find("--machine ram: expected a size such as"), std::string::npos) << size;
  EXPECT_NE(size.find("got \"lots\""), std::string::npos) << size;
}

// Note [Derived budget]: a machine without a headroom gets the one pins derives
// from its RAM, again when --machine changes the RAM; one the trace or
// --machine sets stays.
TEST(SimUnits, AMachineWithoutHeadroomDerivesItFromRam) {
  const std::string fields = R"("ram": "16GiB", "vram": "8GiB", "disk_read_bw": "3GB/s", "ram_copy_bw": "10GB/s",
                                "h2d_bw": "25GB/s")";
  Machine m = machine_of(fields);
  EXPECT_TRUE(m.headroom_derived);
  EXPECT_EQ(m.headroom, 1 * GiB);
  set_machine_field(m, "ram=48GiB");
  EXPECT_EQ(m.headroom, 3 * GiB);
  set_machine_field(m, "ram=128GiB");
  EXPECT_EQ(m.headroom, derive_budget(128 * GiB, 0).headroom);
  EXPECT_EQ(m.headroom, 4 * GiB);
  set_machine_field(m, "headroom=512MiB");
  EXPECT_FALSE(m.headroom_derived);
  set_machine_field(m, "ram=24GiB");
  EXPECT_EQ(m.headroom, 512 * MiB) << "a headroom set by --machine stays";

  const Machine fixed = machine_of(fields + R"(, "headroom": "4GiB")");
  EXPECT_FALSE(fixed.headroom_derived);
  EXPECT_EQ(fixed.headroom, 4 * GiB);
}

}  // namespace
}  // namespace pins::sim
