// The pins-sim command line: the JSON contract, the access dump, --help and
// errors that name the argument or the field, and a smoke run of the bundled
// traces. (The PNG plot is drawn from the JSON by profiling/sim/plot.py:
// tests/python/test_profiling_tools.py.)
#include "profiling/sim/cli.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace pins::sim {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int rc;
  std::string out, err;
};

Result cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int rc = run_cli(args, out, err);
  return {rc, out.str(), err.str()};
}

class TempDir {
 public:
  TempDir() {
    path_ =
        fs::temp_directory_path() / ("pins_sim_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// Two models on a machine whose pins hold half of them: W = 6 GiB, P = 9 - 2
// other - 4 headroom = 3 GiB.
const char* kTrace = R"({
  "name": "contract",
  "machine": {"ram": "9GiB", "vram": "5GiB", "disk_read_bw": "1GB/s", "ram_copy_bw": "10GB/s",
              "h2d_bw": "20GB/s", "headroom": "4GiB", "other_ram": "2GiB", "vram_reserve": "0.5GiB"},
  "models": [
    {"name": "enc", "bytes": "2GiB", "layer_count": 4},
    {"name": "net", "bytes": "4GiB", "layer_count": 8}
  ],
  "prompts": [{"name": "p", "steps": [{"model": "enc"}, {"model": "net", "steps": 3}]}],
  "sequences": [{"name": "rerun", "prompts": ["p"]}, {"name": "twice", "prompts": ["p", "p"]}]
})";

constexpr uint64_t G = 1ull << 30;

TEST(SimCli, JsonCarriesRunsWithDiskAndLowerBound) {
  TempDir d;
  const std::string trace = d.write("t.json", kTrace);
  for (const char* policy : {"lru", "mru", "trace", "reuse", "oracle", "oracle-pins"}) {
    const Result r = cli({"--trace", trace, "--policy", policy, "--runs", "4", "--json"});
    ASSERT_EQ(r.rc, 0) << r.err;
    const json j = json::parse(r.out);  // exactly one JSON object
    ASSERT_TRUE(j.is_object());
    ASSERT_TRUE(j.at("runs").is_array());
    ASSERT_EQ(j["runs"].size(), 4u) << policy;
    for (const json& run : j["runs"]) {
      EXPECT_EQ(run.at("policy"), policy);
      EXPECT_TRUE(run.at("disk_bytes").is_number_unsigned());
      EXPECT_TRUE(run.at("lower_bound_bytes").is_number_unsigned());
      // Note [Simulator oracle]: each oracle meets the bound of its own capacity;
      // every policy meets the RAM bound.
      if (std::string(policy) == "oracle-pins")
        EXPECT_GE(run["disk_bytes"].get<uint64_t>(), run["lower_bound_bytes"].get<uint64_t>()) << "run " << run["run"];
      EXPECT_GE(run["disk_bytes"].get<uint64_t>(), run.at("ram_lower_bound_bytes").get<uint64_t>()) << "run " << run["run"];
      EXPECT_GE(run.at("ram_capacity_bytes").get<uint64_t>(), run.at("pin_capacity_bytes").get<uint64_t>());
      for (const char* k : {"pin_hits", "pin_misses", "time_s", "used_bytes", "cache_bytes"})
        EXPECT_TRUE(run.contains(k)) << k;
    }
    EXPECT_EQ(j["runs"][0]["disk_bytes"], 6 * G) << "the first run reads everything";
    // Run 2: loading enc pushes half of net (four of its layers) off the device
    // and the rest stays: C = 3 + 2 kept, W - C = 6 - 5.
    EXPECT_EQ(j["runs"][1]["used_bytes"], 6 * G);
    EXPECT_EQ(j["runs"][1]["vram_kept_bytes"], 2 * G);
    EXPECT_EQ(j["runs"][1]["cache_bytes"], 5 * G);
    EXPECT_EQ(j["runs"][1]["lower_bound_bytes"], 1 * G);
    EXPECT_TRUE(j.at("policies").at(0).contains("steady_run"));
  }
}

TEST(SimCli, AllPoliciesAndSequencesShareOneRunsList) {
  TempDir d;
  const Result r = cli({"--trace", d.write("t.json", kTrace), "--sequence", "all", "--runs", "3", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("runs").size(), 2u * 4u * 3u);  // sequences x policies x runs
  EXPECT_EQ(j.at("sequences").size(), 2u);
}

TEST(SimCli, DumpWritesOneJsonLinePerAccess) {
  TempDir d;
  const std::string dump = d.file("acc.jsonl");
  const Result r =
      cli({"--trace", d.write("t.json", kTrace), "--policy", "mru", "--runs", "2", "--dump-accesses", dump});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::ifstream f(dump);
  std::string line;
  int n = 0;
  std::set<int> runs;
  while (std::getline(f, line)) {
    const json a = json::parse(line);
    for (const char* k : {"run", "model", "key", "bytes", "subset"}) ASSERT_TRUE(a.contains(k)) << k << " in " << line;
    runs.insert(a["run"].get<int>());
    ++n;
  }
  // Run 1: enc's 4 layers, then net's 8 (net's load pushed enc off the device).
  // Run 2: enc's 4 again, and the 4 layers of net that enc's load pushed off.
  EXPECT_EQ(n, 12 + 8);
  EXPECT_EQ(runs, (std::set<int>{1, 2}));
}

TEST(SimCli, TableAndCsv) {
  TempDir d;
  const std::string csv = d.file("r.csv");
  const Result r = cli({"--trace", d.write("t.json", kTrace), "--runs", "3", "--csv", csv});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("disk GiB read per run"), std::string::npos);
  EXPECT_NE(r.out.find("checks:"), std::string::npos);
  std::ifstream c(csv);
  std::string header, row;
  std::getline(c, header);
  EXPECT_EQ(header.rfind("trace,sequence,policy,run,prompt,disk_bytes,lower_bound_bytes", 0), 0u);
  int rows = 0;
  while (std::getline(c, row)) ++rows;
  EXPECT_EQ(rows, 4 * 3);
}

TEST(SimCli, HelpGoesToStdoutAndSucceeds) {
  for (const char* flag : {"--help", "-h"}) {
    const Result r = cli({flag});
    EXPECT_EQ(r.rc, 0) << flag;
    EXPECT_EQ(r.out.rfind("usage: pins-sim --trace FILE", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("--sequence NAME|all"), std::string::npos);
    EXPECT_TRUE(r.err.empty()) << r.err;
  }
  // Anywhere on the line, and before a missing --trace is noticed.
  EXPECT_EQ(cli({"--runs", "2", "--help"}).rc, 0);
}

TEST(SimCli, UnknownOrIncompleteArgumentsFailNamingThem) {
  const Result unknown = cli({"--trace", "t.json", "--frobnicate"});
  EXPECT_EQ(unknown.rc, 2);
  EXPECT_TRUE(unknown.out.empty());
  EXPECT_EQ(unknown.err.rfind("pins-sim: unknown argument \"--frobnicate\"\n", 0), 0u) << unknown.err;
  EXPECT_NE(unknown.err.find("usage: pins-sim"), std::string::npos);
  const Result no_value = cli({"--trace"});
  EXPECT_EQ(no_value.rc, 2);
  EXPECT_NE(no_value.err.find("--trace needs a value"), std::string::npos) << no_value.err;
  const Result no_trace = cli({});
  EXPECT_EQ(no_trace.rc, 2);
  EXPECT_NE(no_trace.err.find("--trace FILE is required"), std::string::npos) << no_trace.err;
  const Result runs = cli({"--trace", "t.json", "--runs", "0"});
  EXPECT_EQ(runs.rc, 2);
  EXPECT_NE(runs.err.find("--runs: expected a positive integer, got \"0\""), std::string::npos) << runs.err;
}

TEST(SimCli, InvalidTracesNameTheField) {
  TempDir d;
  const auto error_for = [&](const std::string& from, const std::string& to) {
    std::string text = kTrace;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    const Result r = cli({"--trace", d.write("bad.json", text), "--json"});
    EXPECT_EQ(r.rc, 2);
    EXPECT_TRUE(r.out.empty());
    return r.err;
  };
  EXPECT_NE(error_for(R"("vram": "5GiB", )", "").find("machine.vram: missing"), std::string::npos);
  EXPECT_NE(error_for(R"("ram": "9GiB")", R"("ram": "lots")").find("machine.ram: expected a size"), std::string::npos);
  EXPECT_NE(error_for(R"("disk_read_bw": "1GB/s")", R"("disk_read_bw": "1GB/h")").find("machine.disk_read_bw"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"model": "net", "steps": 3})", R"({"model": "nett", "steps": 3})")
                .find("prompts[0].steps[1].model: unknown model \"nett\""),
            std::string::npos);
  EXPECT_NE(error_for(R"("steps": 3)", R"("steps": 0)").find("prompts[0].steps[1].steps"), std::string::npos);
  EXPECT_NE(error_for(R"("layer_count": 4)", R"("layer_count": 4, "params": "x")").find("models[0]"),
            std::string::npos);
  EXPECT_NE(error_for(R"("prompts": ["p", "p"])", R"("prompts": ["p", "q"])").find("sequences[1].prompts[1]"),
            std::string::npos);
  EXPECT_NE(
      error_for(R"("headroom": "4GiB")", R"("headroom": "4GiB", "swapp": 0)").find("machine.swapp: unknown field"),
      std::string::npos);
  EXPECT_NE(error_for("\"name\": \"contract\",", "\"name\": \"contract\"").find("not valid JSON"), std::string::npos);
  const Result missing = cli({"--trace", d.file("absent.json")});
  EXPECT_EQ(missing.rc, 2);
  EXPECT_NE(missing.err.find("cannot open"), std::string::npos);
  const Result bad_policy = cli({"--trace", d.write("t.json", kTrace), "--policy", "fifo"});
  EXPECT_EQ(bad_policy.rc, 2);
  EXPECT_NE(bad_policy.err.find("--policy"), std::string::npos);
  const Result bad_sequence = cli({"--trace", d.write("t.json", kTrace), "--sequence", "nope"});
  EXPECT_NE(bad_sequence.err.find("no sequence \"nope\" (sequences: rerun, twice)"), std::string::npos);
}

// Every bundled trace loads; a few runs of WAN 2.2 A14B on 32 GB of RAM and 32 GB
// of VRAM show lru's cascade and mru's steady state.
TEST(SimCli, BundledTracesSmoke) {
  int traces = 0;
  for (const auto& entry : fs::directory_iterator(PINS_SIM_TRACES_DIR)) {
    if (entry.path().extension() != ".json") continue;
    ++traces;
    const Result r = cli({"--trace", entry.path().string(), "--sequence", "all", "--policy", "oracle,oracle-pins", "--runs", "2",
                          "--json", "--params", std::string(PINS_SIM_DATA_DIR) + "/model_params.csv"});
    ASSERT_EQ(r.rc, 0) << entry.path() << ": " << r.err;
    const json parsed = json::parse(r.out);  // named: a range-for over a temporary's member dangles
    for (const json& run : parsed.at("runs"))
      EXPECT_GE(run["disk_bytes"].get<uint64_t>(),
                run[run["policy"] == "oracle" ? "ram_lower_bound_bytes" : "lower_bound_bytes"].get<uint64_t>())
          << entry.path() << " " << run["policy"] << " " << run["sequence"] << " run " << run["run"]
          << ": the oracle beat its bound";
  }
  EXPECT_GE(traces, 4);
  const Result r = cli({"--trace", std::string(PINS_SIM_TRACES_DIR) + "/wan22_a14b_32g_ram_32g_vram.json", "--policy",
                        "lru,mru", "--runs", "4", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  const json& lru_last = j["runs"][3];
  const json& mru_last = j["runs"][7];
  ASSERT_EQ(lru_last["policy"], "lru");
  EXPECT_GE(lru_last["disk_bytes"].get<double>(), 0.9 * lru_last["used_bytes"].get<double>()) << "the LRU cascade";
  EXPECT_LT(mru_last["disk_bytes"].get<double>(), 0.75 * mru_last["used_bytes"].get<double>());
  EXPECT_LE(j["policies"][1]["steady_run"].get<int>(), 3);
}

// Note [Pressure from others]: the modelled monitor (on by default, checking
// after every cast) leaves pins' own slack inside a node alone, so it reads
// what a replay without it reads; a monitor whose line is the headroom frees
// that slack and reads more (SDXL on 16 GB, rerun: 21.5 -> 36.0 GiB with mru).
TEST(SimCli, TheMonitorLeavesPinsOwnSlack) {
  const std::string trace = std::string(PINS_SIM_TRACES_DIR) + "/sdxl_refiner_16g_ram_8g_vram.json";
  const auto disk = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--trace", trace, "--sequence", "rerun", "--policy", "mru,trace", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = cli(args);
    EXPECT_EQ(r.rc, 0) << r.err;
    const json j = json::parse(r.out);
    std::map<std::string, uint64_t> bytes;
    int64_t reliefs = 0;
    for (const json& run : j.at("runs")) {
      bytes[run["policy"].get<std::string>()] += run["disk_bytes"].get<uint64_t>();
      reliefs += run["monitor_reliefs"].get<int64_t>();
    }
    return std::make_pair(bytes, reliefs);
  };
  const auto [with_monitor, reliefs] = disk({});
  const auto [without, none] = disk({"--no-monitor"});
  const auto [at_headroom, at_headroom_reliefs] = disk({"--monitor-at-headroom"});
  EXPECT_EQ(reliefs, 0);
  EXPECT_EQ(none, 0);
  EXPECT_EQ(with_monitor, without);
  // A monitor at the headroom calls relieve() whenever pins are in their own
  // slack, and relieve() leaves it to them as a boundary does (Note [Pressure
  // from others]); before 2026-12 it freed it and read over 1 GiB more here.
  EXPECT_GT(at_headroom_reliefs, 0);
  EXPECT_EQ(at_headroom, with_monitor);
}

// Note [Cap budget]: --conf cap: reaches the simulated pool, and the balancer
// frees under it along its tiers, so the policies differ there as under RAM.
// Two models of four 512 MiB layers, one pass each, in turn, under a cap of
// six layers and RAM for all: mru takes the other model's two newest pins at
// every prompt; the trace, following a's record from the third prompt, refuses
// a's two missing pins rather than take b's, used sooner (Note [Trace bypass]):
// b hits everything, a reads the same two every turn, half mru's misses.
TEST(SimCli, ACapIsABudgetThePoliciesChooseUnder) {
  TempDir d;
  const std::string trace = d.write("alt.json", R"({
    "name": "two models in turn",
    "machine": {"ram": "64GiB", "vram": "1GiB", "disk_read_bw": "1GB/s", "ram_copy_bw": "10GB/s",
                "h2d_bw": "20GB/s", "headroom": "4GiB", "other_ram": "2GiB", "vram_reserve": "0.5GiB"},
    "models": [{"name": "a", "bytes": "2GiB", "layer_count": 4}, {"name": "b", "bytes": "2GiB", "layer_count": 4}],
    "prompts": [{"name": "pa", "steps": [{"model": "a"}]}, {"name": "pb", "steps": [{"model": "b"}]}],
    "sequences": [{"name": "alternate", "prompts": ["pa", "pb"], "runs": 6}]
  })");
  // Each run: {pin_hits, pin_misses, refusals, evicted_bytes in layers}.
  const auto runs = [&](const std::string& policy, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--trace", trace, "--policy", policy, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = cli(args);
    EXPECT_EQ(r.rc, 0) << r.err;
    std::vector<std::vector<uint64_t>> out;
    const json j = json::parse(r.out);
    for (const json& run : j.at("runs"))
      out.push_back({run["pin_hits"].get<uint64_t>(), run["pin_misses"].get<uint64_t>(),
                     run["refusals"].get<uint64_t>(), run["evicted_bytes"].get<uint64_t>() / (G / 2)});
    return out;
  };
  using Runs = std::vector<std::vector<uint64_t>>;
  const std::string cap = "cap:3GiB";
  EXPECT_EQ(runs("mru", {"--conf", cap}),
            (Runs{{0, 4, 0, 0}, {0, 4, 0, 2}, {2, 2, 0, 2}, {2, 2, 0, 2}, {2, 2, 0, 2}, {2, 2, 0, 2}}));
  EXPECT_EQ(runs("trace", {"--conf", cap}),
            (Runs{{0, 4, 0, 0}, {0, 4, 0, 2}, {2, 2, 2, 0}, {4, 0, 0, 0}, {2, 2, 2, 0}, {4, 0, 0, 0}}));
  // Without the cap both models stay pinned.
  for (const char* policy : {"mru", "trace"})
    EXPECT_EQ(runs(policy, {}), (Runs{{0, 4, 0, 0}, {0, 4, 0, 0}, {4, 0, 0, 0}, {4, 0, 0, 0}, {4, 0, 0, 0}, {4, 0, 0, 0}}))
        << policy;
}

// --suite (profiling/sim/suite.h): the report, errors naming the argument, and
// a scenario written out as a trace.
TEST(SimCli, Suite) {
  const std::string csv_arg = std::string(PINS_SIM_DATA_DIR) + "/model_params.csv";
  const Result r = cli({"--suite", "--scenarios", "8", "--threads", "1", "--params", csv_arg});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("seed 1, 8 scenarios"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per pattern"), std::string::npos);
  EXPECT_NE(r.out.find("\nRESULT policy=trace seed=1 scenarios=8 vs_oracle="), std::string::npos) << r.out;

  const Result mixed = cli({"--suite", "--trace", "x.json"});
  EXPECT_EQ(mixed.rc, 2);
  EXPECT_NE(mixed.err.find("--suite generates its scenarios"), std::string::npos) << mixed.err;
  const Result bad_seed = cli({"--suite", "--seed", "abc"});
  EXPECT_EQ(bad_seed.rc, 2);
  EXPECT_NE(bad_seed.err.find("--seed: expected an integer of at least 0, got \"abc\""), std::string::npos)
      << bad_seed.err;
  const Result bad_count = cli({"--suite", "--scenarios", "0"});
  EXPECT_NE(bad_count.err.find("--scenarios: expected a positive integer, got \"0\""), std::string::npos);
  // Past an int: an error, not a wrapped (negative) count.
  const Result huge = cli({"--suite", "--scenarios", "3000000000"});
  EXPECT_EQ(huge.rc, 2);
  EXPECT_NE(huge.err.find("--scenarios: expected a positive integer, got \"3000000000\""), std::string::npos)
      << huge.err;

  // A scenario written out replays as a trace, with the same oracle figures.
  TempDir d;
  const std::string file = d.file("s4.json");
  ASSERT_EQ(cli({"--suite", "--write-trace", "4:" + file, "--params", csv_arg}).rc, 0);
  const Result replay = cli({"--trace", file, "--policy", "oracle", "--markdown"});
  ASSERT_EQ(replay.rc, 0) << replay.err;
  EXPECT_NE(replay.out.find("| one-off |"), std::string::npos) << replay.out;  // pattern_of(4)
  const Result bad_write = cli({"--suite", "--write-trace", "4"});
  EXPECT_EQ(bad_write.rc, 2);
  EXPECT_NE(bad_write.err.find("--write-trace: expected INDEX:FILE"), std::string::npos) << bad_write.err;
}

}  // namespace
}  // namespace pins::sim
