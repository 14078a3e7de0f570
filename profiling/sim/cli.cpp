#include "profiling/sim/cli.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <thread>

#include "csrc/base/check.h"
#include "csrc/config/config.h"
#include "profiling/sim/report.h"
#include "profiling/sim/suite.h"

namespace pins::sim {

namespace {

const char* kUsage =
    "usage: pins-sim --trace FILE [options]\n"
    "       pins-sim --suite [--suite-kind K] [--seed N] [--scenarios N] [--threads N] [--policy LIST] [--csv FILE]\n"
    "                [--runs-csv FILE] [--conf TEXT]\n"
    "Replays a workflow trace through the pin policies over a modelled machine (docs/SIMULATOR.md).\n"
    "  --trace FILE            the trace (JSON; profiling/traces/ holds the bundled ones)\n"
    "  --sequence NAME|all     which of the trace's sequences (default: its first)\n"
    "  --policy LIST|all       lru, mru, trace, reuse, clairvoyant, oracle, oracle-pins, comma-separated\n"
    "                          (default, all: lru, mru, trace, oracle; --suite: lru, mru, trace, reuse)\n"
    "  --runs N                runs to replay (default: the sequence's \"runs\")\n"
    "  --json                  print one JSON object instead of the table\n"
    "  --markdown              print the docs/SIMULATOR.md summary rows (--markdown-header: the header too)\n"
    "  --csv FILE              write one CSV row per sequence, policy and run\n"
    "  --dump-accesses FILE    write the expanded accesses, one JSON line each\n"
    "  --params FILE           model parameter list for \"params\" layers (default: profiling/data/model_params.csv)\n"
    "  --machine FIELD=VALUE   override a machine field, e.g. other_ram=6GiB (repeatable)\n"
    "  --conf TEXT             balancer configuration in PINS_CONF syntax, e.g. fast_disk:true\n"
    "  --no-relieve            no RAM-pressure check at node boundaries, nor from the monitor\n"
    "  --no-monitor            no modelled pressure monitor (it checks after every cast; Note [Pressure from others])\n"
    "  --monitor-at-headroom   the monitor calls relieve() below the headroom itself (as before), which leaves pins' own slack\n"
    "  --buffered-fills        pins filled through the page cache (a loader's mapping), not as load_file fills them\n"
    "  --mark upfront|on-use   mark a prompt's models at its start (default) or at each model's first step\n"
    "  --no-device-bytes       the application does not say each model's bytes on the device (pins.set_device_bytes)\n"
    "  --suite                 replay the generated scenario suite instead of a trace (docs/SIMULATOR.md\n"
    "                          \"The scenario suite\"): figures per policy against the oracle, mru and lru\n"
    "  --suite-kind K          suite (default: today's schedule of 14 patterns), v1 (the 10 before issue 39) or\n"
    "                          unseen (the held-out sets: other families and machines, Note [Simulator unseen sets])\n"
    "  --seed N                the suite's seed (default 1)\n"
    "  --scenarios N           the suite's size (default 200)\n"
    "  --threads N             replay the suite on N threads (default: the hardware's)\n"
    "  --runs-csv FILE         with --suite: also write one CSV row per scenario, policy and run (the first too)\n"
    "  --write-trace I:FILE    write scenario I of the suite as a trace file (replay it with --trace)\n"
    "  -h, --help              print this text\n"
    "The plot: python profiling/sim/plot.py REPORT.json OUT.png, REPORT.json from --json.\n"
    "Exit status: 0 ok, 2 bad usage or an invalid trace (the message names the argument or the field).\n";

struct Options {
  std::string trace, sequence, params, csv, runs_csv, dump, conf;
  std::vector<std::string> policies, machine;
  int runs = 0;
  bool suite = false;
  SuiteKind kind = SuiteKind::Suite;
  uint64_t seed = 1;
  int scenarios = 200, threads = 0;
  std::string write_trace;
  bool help = false, json = false, markdown = false, markdown_header = false;
  ReplayOptions replay;
};

// The balancer's policies, by their PINS_CONF names, then Belady's oracle
// (Note [Simulator oracle]). --policy names the others on request: reuse, the
// clairvoyant reuse policy (told every key's next use: what the best eviction
// order achieves within the balancer's budget) and the pin-capacity oracle.
const std::vector<std::string>& all_policies() {
  static const std::vector<std::string> names = {to_string(PolicyKind::Lru), to_string(PolicyKind::Mru),
                                                 to_string(PolicyKind::Trace), "oracle"};
  return names;
}
bool known_policy(const std::string& p) {
  return p == "reuse" || p == "oracle-pins" || p == "clairvoyant" ||
         std::find(all_policies().begin(), all_policies().end(), p) != all_policies().end();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

// An integer from `min` to `max`; the error names the argument and the value
// ("a positive integer" for min 1).
long long integer_arg(const std::string& arg, const std::string& v, long long min,
                      long long max = std::numeric_limits<int>::max()) {
  try {
    size_t used = 0;
    const long long n = std::stoll(v, &used);
    if (used == v.size() && n >= min && n <= max) return n;
  } catch (const std::exception&) {
  }
  const std::string want = min == 1 ? "a positive integer" : "an integer of at least " + std::to_string(min);
  throw std::invalid_argument(arg + ": expected " + want + ", got \"" + v + "\"");
}

Options parse_args(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
      return args[++i];
    };
    if (a == "--trace") o.trace = value();
    else if (a == "--sequence") o.sequence = value();
    else if (a == "--policy") {
      const std::string v = value();
      o.policies = v == "all" ? all_policies() : split(v, ',');
      for (const std::string& p : o.policies)
        if (!known_policy(p))
          throw std::invalid_argument(
              "--policy: expected lru, mru, trace, reuse, clairvoyant, oracle, oracle-pins or all, got \"" + p + "\"");
    } else if (a == "--runs") o.runs = static_cast<int>(integer_arg(a, value(), 1));
    else if (a == "--suite") o.suite = true;
    else if (a == "--suite-kind") {
      const std::string v = value();
      const std::optional<SuiteKind> k = parse_suite_kind(v);
      if (!k) throw std::invalid_argument("--suite-kind: expected suite, v1 or unseen, got \"" + v + "\"");
      o.kind = *k;
    } else if (a == "--seed") o.seed = static_cast<uint64_t>(integer_arg(a, value(), 0, std::numeric_limits<long long>::max()));
    else if (a == "--scenarios") o.scenarios = static_cast<int>(integer_arg(a, value(), 1));
    else if (a == "--write-trace") o.write_trace = value();
    else if (a == "--threads") o.threads = static_cast<int>(integer_arg(a, value(), 1));
    else if (a == "--json") o.json = true;
    else if (a == "--markdown") o.markdown = true;
    else if (a == "--markdown-header") o.markdown = o.markdown_header = true;
    else if (a == "--csv") o.csv = value();
    else if (a == "--runs-csv") o.runs_csv = value();
    else if (a == "--dump-accesses") o.dump = value();
    else if (a == "--params") o.params = value();
    else if (a == "--machine") o.machine.push_back(value());
    else if (a == "--conf") o.replay.conf = value();
    else if (a == "--no-relieve") o.replay.relieve = o.replay.monitor = false;
    else if (a == "--no-monitor") o.replay.monitor = false;
    else if (a == "--monitor-at-headroom") o.replay.monitor_at_headroom = true;
    else if (a == "--buffered-fills") o.replay.direct_fills = false;
    else if (a == "--no-device-bytes") o.replay.device_bytes = false;
    else if (a == "--mark") {
      const std::string v = value();
      if (v == "upfront") o.replay.mark_upfront = true;
      else if (v == "on-use") o.replay.mark_upfront = false;
      else throw std::invalid_argument("--mark: expected upfront or on-use, got \"" + v + "\"");
    } else if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    } else {
      throw std::invalid_argument("unknown argument \"" + a + "\"");
    }
  }
  if (o.suite) {
    if (!o.trace.empty() || !o.sequence.empty() || o.runs || o.json || o.markdown || !o.dump.empty() ||
        !o.machine.empty())
      throw std::invalid_argument(
          "--suite generates its scenarios: --trace, --sequence, --runs, --json, --markdown, --dump-accesses and "
          "--machine do not apply");
    if (o.policies.empty()) o.policies = {"lru", "mru", "trace", "reuse"};
    return o;
  }
  if (!o.runs_csv.empty())
    throw std::invalid_argument("--runs-csv applies to --suite; a trace's --csv already has a row per run");
  if (o.trace.empty()) throw std::invalid_argument("--trace FILE is required");
  if (o.policies.empty()) o.policies = all_policies();
  if (o.json && o.markdown) throw std::invalid_argument("--json and --markdown are exclusive");
  return o;
}

std::ofstream open_out(const std::string& path, const char* what) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error(std::string(what) + ": cannot write " + path);
  return f;
}

// --suite (docs/SIMULATOR.md "The scenario suite").
int run_suite_cli(const Options& o, std::ostream& out) {
  const std::vector<model_params::Model> params =
      model_params::read(o.params.empty() ? model_params::default_path() : o.params);
  if (!o.write_trace.empty()) {
    const size_t colon = o.write_trace.find(':');
    const int index = static_cast<int>(integer_arg("--write-trace", o.write_trace.substr(0, colon), 0));
    if (colon == std::string::npos || colon + 1 == o.write_trace.size())
      throw std::invalid_argument("--write-trace: expected INDEX:FILE, got \"" + o.write_trace + "\"");
    std::ofstream f = open_out(o.write_trace.substr(colon + 1), "--write-trace");
    f << make_scenario(o.seed, index, params, o.kind).json << "\n";
    return 0;
  }
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const SuiteResult r = run_suite(o.seed, o.scenarios, o.policies, params, o.replay, threads, o.kind);
  if (!o.csv.empty()) {
    std::ofstream f = open_out(o.csv, "--csv");
    write_suite_csv(f, r);
  }
  if (!o.runs_csv.empty()) {
    std::ofstream f = open_out(o.runs_csv, "--runs-csv");
    write_suite_runs_csv(f, r);
  }
  print_suite(out, r, to_string(parse_config(o.replay.conf).policy));
  return 0;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Options o;
  try {
    o = parse_args(args);
  } catch (const std::invalid_argument& e) {
    err << "pins-sim: " << e.what() << "\n" << kUsage;
    return 2;
  }
  if (o.help) {
    out << kUsage;
    return 0;
  }
  try {
    if (o.suite) return run_suite_cli(o, out);
    Trace t = load_trace(o.trace, o.params);
    for (const std::string& m : o.machine) set_machine_field(t.machine, m);
    std::vector<const Sequence*> seqs;
    if (o.sequence == "all") {
      for (const Sequence& s : t.sequences) seqs.push_back(&s);
    } else {
      seqs.push_back(o.sequence.empty() ? &t.sequences.front() : &t.sequence(o.sequence));
    }
    std::vector<SequenceResult> results;
    for (const Sequence* s : seqs) {
      SequenceResult r;
      r.sequence = s;
      r.expansion = expand(t, *s, o.runs > 0 ? o.runs : s->runs);
      r.tolerance = steady_tolerance(r.expansion);
      for (const std::string& p : o.policies) r.policies.push_back(replay(t, *s, r.expansion, p, o.replay));
      results.push_back(std::move(r));
    }
    if (!o.dump.empty()) {
      std::ofstream f = open_out(o.dump, "--dump-accesses");
      for (const SequenceResult& r : results) dump_accesses(f, t, r);
    }
    if (!o.csv.empty()) {
      std::ofstream f = open_out(o.csv, "--csv");
      write_csv_header(f);
      for (const SequenceResult& r : results) write_csv(f, t, r);
    }
    if (o.json) {
      nlohmann::ordered_json j;
      if (results.size() == 1) {
        j = to_json(t, results.front());
      } else {
        j["trace"] = t.name;
        j["file"] = t.path;
        j["sequences"] = nlohmann::ordered_json::array();
        j["runs"] = nlohmann::ordered_json::array();
        for (const SequenceResult& r : results) {
          nlohmann::ordered_json one = to_json(t, r);
          for (auto& run : one["runs"]) j["runs"].push_back(run);
          one.erase("runs");
          j["sequences"].push_back(one);
        }
      }
      out << j.dump(2) << "\n";
    } else if (o.markdown) {
      if (o.markdown_header) write_markdown_header(out);
      for (const SequenceResult& r : results) write_markdown_row(out, t, r);
    } else {
      for (size_t i = 0; i < results.size(); ++i) {
        if (i) out << "\n" << std::string(100, '-') << "\n\n";
        print_table(out, t, results[i]);
      }
    }
    return 0;
  } catch (const TraceError& e) {
    err << "pins-sim: " << e.what() << "\n";
    return 2;
  } catch (const ValueError& e) {
    err << "pins-sim: --conf: " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    err << "pins-sim: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "pins-sim: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace pins::sim
