"""The profiling tools agree with independent checks and keep their command-line
contract: the model parameter file is what its generator writes, the simulator's
oracle equals an independent Belady replay of its own access dump on every
bundled trace, its JSON report draws a PNG (profiling/sim/plot.py), and both
executables answer --help on stdout with status 0 and refuse unknown options, and
each pins-bench benchmark (fill, balancer, cast, lowvram) runs at tiny sizes and
ends with one RESULT line of the expected figures, and profiling/sim/heldout.py
counts a held-out set's scenarios as computed here by hand, as
profiling/sim/selector_bounds.py counts its selectors from pins-sim's per-run
CSV (--runs-csv), whose runs sum to the suite's CSV.

The executables: $PINS_SIM and $PINS_BENCH, default build/bin/ of this checkout."""
import csv
import functools
import glob
import json
import math
import os
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = os.environ.get("PINS_SIM") or os.path.join(ROOT, "build", "bin", "pins-sim")
BENCH = os.environ.get("PINS_BENCH") or os.path.join(ROOT, "build", "bin", "pins-bench")
PLOT = os.path.join(ROOT, "profiling", "sim", "plot.py")
TRACES = sorted(glob.glob(os.path.join(ROOT, "profiling", "traces", "*.json")))


def test_model_params_csv_is_what_the_generator_writes():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "data", "gen_model_params.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("trace", TRACES, ids=os.path.basename)
def test_sim_oracle_matches_an_independent_belady(trace, tmp_path):
    dump, result = tmp_path / "acc.jsonl", tmp_path / "oracle.json"
    with open(result, "w") as f:
        run = subprocess.run([SIM, "--trace", trace, "--sequence", "all", "--policy", "oracle,oracle-pins", "--runs",
                              "4", "--json", "--dump-accesses", str(dump)], stdout=f, stderr=subprocess.PIPE, text=True)
    assert run.returncode == 0, run.stderr
    runs = json.load(open(result))["runs"]
    assert {r["policy"] for r in runs} == {"oracle", "oracle-pins"}, "both oracles in the JSON"
    check = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "sim", "check_oracle.py"), str(dump),
                            str(result)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "oracle, oracle-pins match on" in check.stdout, check.stdout
    # Note [Simulator oracle]: over a sequence, the oracle at M (RAM) reads no more than the one at P (pins).
    total = {}
    for r in runs:
        total[(r["sequence"], r["policy"])] = total.get((r["sequence"], r["policy"]), 0) + r["disk_bytes"]
    for (seq, policy), disk in total.items():
        if policy == "oracle":
            assert disk <= total[(seq, "oracle-pins")], seq


def png_size(path):
    """(width, height) from the PNG's IHDR chunk; asserts the signature and that
    the file ends with IEND."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("sequence", ["all", None], ids=["all_sequences", "first_sequence"])
def test_plot_draws_the_json_report(sequence, tmp_path):
    trace = os.path.join(ROOT, "profiling", "traces", "wan22_a14b_32g_ram_32g_vram.json")
    report, png = tmp_path / "report.json", tmp_path / "plot.png"
    args = [SIM, "--trace", trace, "--runs", "3", "--json"] + (["--sequence", sequence] if sequence else [])
    with open(report, "w") as f:
        run = subprocess.run(args, stdout=f, stderr=subprocess.PIPE, text=True)
    assert run.returncode == 0, run.stderr
    panels = len(json.load(open(report)).get("sequences", [None]))
    plot = subprocess.run([sys.executable, PLOT, str(report), str(png)], capture_output=True, text=True)
    assert plot.returncode == 0, plot.stderr
    assert png_size(png) == (1000, 330 * panels), "1000 pixels wide, 330 high per sequence"
    assert os.path.getsize(png) > 10_000, "a blank image is much smaller"


def test_plot_reads_stdin_and_names_what_is_wrong(tmp_path):
    report = subprocess.run([SIM, "--trace", TRACES[0], "--policy", "mru", "--runs", "2", "--json"],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    png = tmp_path / "stdin.png"
    plot = subprocess.run([sys.executable, PLOT, "-", str(png)], input=report.stdout, capture_output=True, text=True)
    assert plot.returncode == 0, plot.stderr
    assert png_size(png) == (1000, 330)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"trace": "t", "sequence": "s", "policies": [{"policy": "lru"}]}))
    plot = subprocess.run([sys.executable, PLOT, str(bad), str(png)], capture_output=True, text=True)
    assert plot.returncode == 2
    assert f"{bad}: (top level): missing \"runs\"" in plot.stderr
    plot = subprocess.run([sys.executable, PLOT, str(tmp_path / "absent.json"), str(png)], capture_output=True,
                          text=True)
    assert plot.returncode == 2 and "absent.json" in plot.stderr


@pytest.mark.parametrize("args,usage", [([SIM, "--help"], "usage: pins-sim"), ([SIM, "-h"], "usage: pins-sim"),
                                        ([BENCH, "--help"], "usage: pins-bench"),
                                        ([BENCH, "alloc", "--help"], "usage: pins-bench alloc"),
                                        ([BENCH, "fill", "--help"], "usage: pins-bench fill"),
                                        ([BENCH, "balancer", "-h"], "usage: pins-bench balancer")],
                         ids=["sim", "sim_h", "bench", "bench_alloc", "bench_fill", "bench_balancer"])
def test_help_prints_usage_to_stdout_and_exits_0(args, usage):
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(usage), out.stdout
    assert out.stderr == ""


BUILD = os.path.join(ROOT, "build")


def _executables(folder):
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in os.listdir(folder)
                  if os.path.isfile(os.path.join(folder, n)) and os.access(os.path.join(folder, n), os.X_OK))


@pytest.mark.skipif(not os.path.isdir(os.path.join(BUILD, "bin")), reason="build/bin not built (make build)")
def test_build_bin_holds_tools_that_answer_help_and_no_test_helper():
    """build/bin is where a user finds pins' tools (and the test suites ctest
    runs): each answers --help with status 0. A program a test runs as its child
    (the chaos test's worker) lives in build/test-helpers instead."""
    tools = _executables(os.path.join(BUILD, "bin"))
    assert "pins-sim" in tools and "pins-bench" in tools, tools
    helpers = _executables(os.path.join(BUILD, "test-helpers"))
    assert not set(helpers) & set(tools), f"test helpers in build/bin: {sorted(set(helpers) & set(tools))}"
    assert not [t for t in tools if "worker" in t or "helper" in t], tools
    for name in tools:
        out = subprocess.run([os.path.join(BUILD, "bin", name), "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"build/bin/{name} --help: status {out.returncode}\n{out.stdout}{out.stderr}"
        assert out.stdout.strip(), f"build/bin/{name} --help printed nothing on stdout"


@pytest.mark.skipif(not os.path.isfile(os.path.join(BUILD, "cmake_install.cmake")), reason="build/ not configured")
def test_install_ships_no_test_program(tmp_path):
    """cmake --install (every component this build has) installs the library, its
    headers and CMake package: no test suite and no test helper."""
    out = subprocess.run(["cmake", "--install", BUILD, "--prefix", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    installed = [os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert any(p.endswith("libpins.so") for p in installed), installed
    built = set(_executables(os.path.join(BUILD, "bin"))) | set(_executables(os.path.join(BUILD, "test-helpers")))
    assert not [p for p in installed if os.path.basename(p) in built or p.startswith("bin")], installed


@pytest.mark.parametrize("args,message", [
    ([SIM, "--trace", "t.json", "--frobnicate"], 'pins-sim: unknown argument "--frobnicate"'),
    ([SIM, "--trace", "t.json", "--runs", "many"], 'pins-sim: --runs: expected a positive integer, got "many"'),
    ([BENCH, "frobnicate"], 'pins-bench: unknown benchmark "frobnicate"'),
    ([BENCH, "alloc", "--frobnicate"], 'pins-bench alloc: unknown option "--frobnicate"'),
    ([BENCH, "alloc", "--reps", "0"], 'pins-bench alloc: --reps: expected a positive integer, got "0"'),
    ([BENCH, "fill", "--frobnicate"], 'pins-bench fill: unknown option "--frobnicate"'),
    ([BENCH, "fill", "--size", "lots"], 'pins-bench fill: --size: expected a size such as 512M or 1.5GiB, got "lots"'),
    ([BENCH, "fill", "--reps"], "pins-bench fill: --reps needs a value"),
    ([BENCH, "balancer", "--pins", "1000,x"],
     'pins-bench balancer: --pins: expected a comma-separated list of positive integers, got "1000,x"'),
    ([BENCH, "balancer", "--policies", "mru,fifo"],
     'pins-bench balancer: --policies: expected a comma-separated list of mru, lru, trace, reuse, got "mru,fifo"'),
    ([BENCH, "balancer", "--decisions", "-3"], 'pins-bench balancer: --decisions: expected a positive integer, got "-3"'),
], ids=["sim_unknown", "sim_runs", "bench_unknown", "bench_alloc_unknown", "bench_alloc_reps", "bench_fill_unknown",
        "bench_fill_size", "bench_fill_no_value", "bench_balancer_pins", "bench_balancer_policies",
        "bench_balancer_decisions"])
def test_unknown_options_fail_with_a_message(args, message):
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.startswith(message), out.stderr


# ---------------------------------------------------------------- pins-bench fill, balancer, cast, lowvram

@functools.lru_cache(maxsize=None)
def bench_has(name):
    """Whether this pins-bench has the benchmark (cast and lowvram need a build with torch)."""
    out = subprocess.run([BENCH, "--help"], capture_output=True, text=True)
    return any(line.split()[:1] == [name] for line in out.stdout.splitlines())


def needs_torch_benchmarks():
    if not (bench_has("cast") and bench_has("lowvram")):
        pytest.skip("pins-bench was built without torch (PINS_WITH_TORCH=OFF): no cast or lowvram benchmark")


def result_of(stdout):
    """The figures of the RESULT line, which must be the last line and the only one."""
    lines = stdout.rstrip("\n").splitlines()
    assert lines and lines[-1].startswith("RESULT "), stdout[-2000:]
    assert sum(line.startswith("RESULT") for line in lines) == 1, stdout[-2000:]
    figures = {}
    for item in lines[-1].split()[1:]:
        key, sep, value = item.partition("=")
        assert sep and key not in figures, item
        figures[key] = float(value)
        assert math.isfinite(figures[key]), item
    return figures


def run_bench(*args, timeout=300):
    out = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    return out.stdout, result_of(out.stdout)


def test_bench_fill_ends_with_its_ratios():
    stdout, figures = run_bench("fill", "--size", "8M", "--reps", "2", "--threads", "2")
    assert set(figures) == {"fill_warm_ratio", "fill_fresh_ratio", "fill_cold_ratio", "fill_cold_noprewarm_ratio",
                            "fill_cold_racing_ratio", "fill_warm_mt_ratio"}
    assert all(v > 0 for v in figures.values()), figures
    assert "baseline memcpy, warm malloc" in stdout  # per-repetition lines above the RESULT
    # Note [Warm idle memory]: the pin evicted by Balancer::free stays committed for the next one,
    # and the cold variant commits fresh pages every time.
    lines = stdout.splitlines()
    evict = lines.index("fresh: default config, evicted by Balancer::free")
    assert "extents committed 1, decommitted 0 over 2 pins" in "\n".join(lines[evict:evict + 6]), stdout
    cold = next(i for i, line in enumerate(lines) if line.startswith("cold: "))
    assert "extents committed 2, decommitted 2 over 2 pins" in "\n".join(lines[cold:cold + 6]), stdout
    # Note [Prewarm]: with the prewarm waited for, the pins commit nothing on the hot path.
    ahead = next(i for i, line in enumerate(lines) if line.startswith("cold+prewarm: "))
    assert "extents committed 0, decommitted 2 over 2 pins" in "\n".join(lines[ahead:ahead + 7]), stdout
    assert "8.0 MiB of the pins' memory came from it" in "\n".join(lines[ahead:ahead + 8]), stdout


def test_bench_load_reads_the_file_once_and_leaves_no_second_copy(tmp_path):
    stdout, figures = run_bench("load", "--size", "24M", "--reps", "2", "--dir", str(tmp_path))
    assert set(figures) == {"load_ratio", "direct_ratio", "mmap_ratio", "cached_after_pins_pct",
                            "cached_after_mmap_pct"}
    assert figures["load_ratio"] > 0 and figures["direct_ratio"] > 0 and figures["mmap_ratio"] > 0, figures
    # Note [File reads]: a fill from the file leaves (almost) nothing in the page cache; a copy through the
    # mapping leaves the whole range there. Only where the kernel drops a file's pages at all (a tmpfs
    # holds them whatever it is told; the benchmark counts them before each read).
    if "(at most 0 of" in stdout:
        assert figures["cached_after_pins_pct"] < 1.0, stdout
        assert figures["cached_after_mmap_pct"] > 90.0, stdout
    if "O_DIRECT available" in stdout:
        assert "fills from the file: 2, 2 with O_DIRECT" in stdout, stdout
    assert os.listdir(tmp_path) == [], "the benchmark's file was not removed"


def test_bench_balancer_ends_with_decision_costs_per_policy_and_count():
    stdout, figures = run_bench("balancer", "--pins", "40,80", "--reps", "2", "--decisions", "3")
    expected = {"floor_growth"}  # the index floor under every policy's growth, measured in the same run
    for policy in ("mru", "trace", "lru"):
        expected |= {f"decision_growth_{policy}", f"decision_growth_over_floor_{policy}",
                     f"end_prompt_growth_{policy}", f"hit_us_{policy}_first", f"hit_us_{policy}_kept"}
        for n in (40, 80):
            expected |= {f"decision_us_{policy}_{n}", f"end_prompt_us_{policy}_{n}",
                         f"first_decision_us_{policy}_{n}", f"sweep_us_{policy}_{n}"}
    assert set(figures) == expected
    assert all(v > 0 for v in figures.values()), figures
    # The over-floor figure is the growth divided by the floor's (each printed to two decimals).
    floor = figures["floor_growth"]
    for policy in ("mru", "trace", "lru"):
        growth, over = figures[f"decision_growth_{policy}"], figures[f"decision_growth_over_floor_{policy}"]
        assert (growth - 0.005) / (floor + 0.005) - 0.005 <= over <= (growth + 0.005) / (floor - 0.005) + 0.005, \
            figures
    # N stays N through the decisions and the boundaries; trace keeps following its record.
    assert "trace, 80 pins (80 at the end; trace departures during decisions: 0)" in stdout, stdout
    # Note [Trace memory]: the hits once every kept record is such a prompt (eight); mru keeps none.
    assert "hit, 8 records kept" in stdout and "hit, 0 records kept" in stdout, stdout


def test_bench_balancer_policies_option_selects_them():
    _, figures = run_bench("balancer", "--pins", "20,30", "--policies", "lru", "--reps", "1", "--decisions", "1")
    assert set(figures) == {"decision_us_lru_20", "decision_us_lru_30", "end_prompt_us_lru_20",
                            "end_prompt_us_lru_30", "first_decision_us_lru_20", "first_decision_us_lru_30",
                            "sweep_us_lru_20", "sweep_us_lru_30", "decision_growth_lru",
                            "decision_growth_over_floor_lru", "floor_growth", "end_prompt_growth_lru",
                            "hit_us_lru_first", "hit_us_lru_kept"}


def test_bench_cast_ends_with_overheads_and_bandwidth_ratio():
    needs_torch_benchmarks()
    stdout, figures = run_bench("cast", "--size", "1M", "--calls", "50", "--reps", "2", "--cold", "64")
    assert set(figures) == {"hit_overhead_us", "hit_ratio", "op_overhead_us", "op_ratio", "hit_bw_ratio", "check_us",
                            "check_cold_us", "check_cold_64k_us"}
    assert all(figures[k] > 0 for k in ("hit_ratio", "op_ratio", "hit_bw_ratio")), figures
    assert "the same bytes" in stdout  # on a CPU-only machine a hit and a copy move the same bytes: said so
    assert "content check: " in stdout and "content check, cold: " in stdout  # Note [Content check]: on against off


def test_bench_lowvram_ends_with_pass_ratios_per_policy():
    needs_torch_benchmarks()
    stdout, figures = run_bench("lowvram", "--layers", "4", "--layer-mib", "1", "--passes", "2", "--policies",
                                "mru,trace")
    # Note [Prewarm]: each policy with the prewarm waited for (the default), off, and racing the pass.
    assert set(figures) == {f"{k}_pass_ratio_{p}{v}" for k in ("first", "steady") for p in ("mru", "trace")
                            for v in ("", "_noprewarm", "_racing")}
    assert all(v > 0 for v in figures.values()), figures
    assert 'configure("policy:trace,headroom:' in stdout  # the budget it set is printed
    assert "prewarm before the pass (untimed)" in stdout


@pytest.mark.parametrize("name", ["cast", "lowvram"])
def test_bench_torch_benchmarks_answer_help(name):
    needs_torch_benchmarks()
    out = subprocess.run([BENCH, name, "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: pins-bench {name}"), out.stdout
    if name == "lowvram":
        assert "RSS" in out.stdout  # the sources alone take layers x layer-mib


@pytest.mark.parametrize("args,message", [
    (["cast", "--calls", "0"], 'pins-bench cast: --calls: expected a positive integer, got "0"'),
    (["cast", "--frobnicate"], 'pins-bench cast: unknown option "--frobnicate"'),
    (["lowvram", "--passes", "1"], "pins-bench lowvram: --passes: expected at least 2"),
    (["lowvram", "--layer-mib", "big"], 'pins-bench lowvram: --layer-mib: expected a positive integer, got "big"'),
    (["lowvram", "--policies", "belady"],
     'pins-bench lowvram: --policies: expected a comma-separated list of mru, lru, trace, got "belady"'),
], ids=["cast_calls", "cast_unknown", "lowvram_passes", "lowvram_layer_mib", "lowvram_policies"])
def test_bench_torch_benchmarks_refuse_bad_options(args, message):
    needs_torch_benchmarks()
    out = subprocess.run([BENCH, *args], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.startswith(message), out.stderr


# ---------------------------------------------------------------- the cast from Python: one dispatch (docs/PERFORMANCE.md)

def test_bench_cast_python_ends_with_per_call_costs():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_cast_python.py"), "--calls", "200",
                          "--reps", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    figures = result_of(out.stdout)
    # The extension's own figure where this configuration loads torch_pins._C (tests/python/test_fast_path.py
    # checks that the repository's build makes it).
    import torch_pins

    fast = {"py_fast_hit_us"} if torch_pins._C is not None else set()
    assert set(figures) == {"py_clone_us", "py_op_hit_us", "py_hit_us", "py_plain_us", "py_miss_us",
                            "py_hit_overhead_us"} | fast
    positive = {"py_clone_us", "py_op_hit_us", "py_hit_us", "py_plain_us", "py_miss_us"} | fast
    assert all(figures[k] > 0 for k in positive), figures
    # Every op-hit, fast-hit and hit call (2 x 200 each, plus 100 of warm-up) was a hit.
    assert f"hits served: {500 * (3 if fast else 2)} " in out.stdout, out.stdout
    assert "the same bytes" in out.stdout


def test_bench_miss_ends_with_miss_and_hit_ratios():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_miss.py"), "--mib", "1",
                          "--reps", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    figures = result_of(out.stdout)
    assert set(figures) == {"miss_ratio", "hit_ratio", "miss_same_ratio", "hit_same_ratio"}
    assert all(v > 0 for v in figures.values()), figures
    # Two misses and two hits per repetition, each what its name says.
    assert "misses 4, hits 4" in out.stdout, out.stdout
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_miss.py"), "--mib", "0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--mib and --reps must be positive, got 0 and 15" in bad.stderr, bad.stderr


def test_bench_cast_python_refuses_a_bad_option():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_cast_python.py"), "--calls", "0"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "--calls and --reps must be positive" in out.stderr, out.stderr


def test_bench_prefetch_runs_every_mode_in_order_on_the_cpu():
    """profiling/bench_prefetch.py's dry run: every mode on the CPU, each output
    checked against the resident stack's, and the RESULT line."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_prefetch.py"), "--device", "cpu",
                          "--layers", "3", "--dim", "32", "--heads", "2", "--batch", "2", "--tokens", "8", "--reps",
                          "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    for mode in ("resident", "to", "pins", "pins-prefetch"):
        assert f"  {mode} " in out.stdout, out.stdout
    assert out.stdout.strip().splitlines()[-1].startswith("RESULT prefetch_vs_to="), out.stdout
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_prefetch.py"), "--dim", "30"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--dim a multiple of --heads" in bad.stderr, bad.stderr


def test_the_gpu_check_writes_no_more_files_than_a_device_call_returns():
    """A device call returns at most 8 files from $OUT; the rest are lost. Every
    file the GPU check script names under $OUT counts, its scratch file too."""
    import re
    script = open(os.path.join(ROOT, "profiling", "gpu_check.sh")).read()
    names = set(re.findall(r'\$OUT/([A-Za-z0-9_.-]+)', script))
    assert 0 < len(names) <= 8, sorted(names)
    assert ".gpu-deps" in script and "gpu_prepare.sh" in script  # says what to carry, and stops without it


def test_bench_file_hit_ends_with_its_result_line():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_file_hit.py"), "--reps", "1",
                          "--hits", "20"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    keys = dict(kv.split("=") for kv in last.split()[1:])
    assert last.startswith("RESULT ") and set(keys) == {"file_hit_us", "plain_hit_us", "file_hit_extra_us",
                                                        "file_hit_ratio"}, last


def _hog_check():
    """profiling/hog_check.py as a module (it is run by hand, never in CI:
    docs/RELIABILITY.md "Memory pressure from another process")."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("hog_check", os.path.join(ROOT, "profiling", "hog_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hog_check_finds_the_episodes_below_a_line():
    h = _hog_check()
    samples = [(0.0, 5), (0.1, 3), (0.2, 2), (0.3, 6), (0.4, 4), (0.5, 1), (0.6, 1)]
    assert h.episodes(samples, 4, 0.0, 1.0) == [(0.1, pytest.approx(0.2)), (0.5, math.inf)]
    assert h.episodes(samples, 4, 0.3, 1.0) == [(0.5, math.inf)], "only episodes that begin in the window"
    assert h.parse_size("8G") == 8 << 30 and h.parse_size("512MiB") == 512 << 20 and h.parse_size("4096") == 4096


def test_hog_check_answers_help_without_running():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "hog_check.py"), "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--machine" in out.stdout and "--no-monitor" in out.stdout


HELDOUT = os.path.join(ROOT, "profiling", "sim", "heldout.py")
HELDOUT_HEADER = "seed,scenario,name,pattern,policy,disk_bytes,oracle_bytes,ram_bound_bytes,allowance_bytes,runs\n"


def heldout(*args):
    return subprocess.run([sys.executable, HELDOUT, *args], capture_output=True, text=True)


def test_heldout_counts_each_policy_against_the_better_of_the_others(tmp_path):
    """Three scenarios with figures chosen by hand (GiB; a layer is 1): trace
    over min(lru, mru) + 1 on two, one of them 1.5x mru; mru over lru + 1 on
    one; clairvoyant over on none. The set's CSV exists, so nothing runs."""
    rows = {  # name: (pattern, oracle, {policy: disk})
        "u7-0-two-interleaved": ("two-interleaved", 8, {"lru": 10, "mru": 12, "trace": 15, "clairvoyant": 9}),
        "u7-1-one-off": ("one-off", 6, {"lru": 20, "mru": 8, "trace": 12, "clairvoyant": 8}),
        "u7-2-one-off": ("one-off", 4, {"lru": 5, "mru": 5, "trace": 5, "clairvoyant": 5}),
    }
    gib = 2**30
    with open(tmp_path / "u7.csv", "w") as f:
        f.write(HELDOUT_HEADER)
        for i, (name, (pattern, oracle, disk)) in enumerate(rows.items()):
            for policy, d in disk.items():
                f.write(f"7,{i},{name},{pattern},{policy},{d * gib},{oracle * gib},0,{gib},6\n")
    out = heldout("--seeds", "7", "--csv-dir", str(tmp_path), "--sim", str(tmp_path / "no-sim"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "RESULT over=2 sets_over_1=1 over_1_25_mru=1 scenarios=3 sets=1" in out.stdout, out.stdout
    # The set's row: trace / oracle = 32 / 18; u7-0 is 15 / 12 = 1.25x mru (not over 1.25), u7-1 1.5x.
    set_row = next(line.split() for line in out.stdout.splitlines() if line.split()[:1] == ["7"])
    assert set_row == ["7", "1.778", "2", "1.50", "0", "1"], out.stdout
    shape = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()
             if line.split()[:1] in (["one-off"], ["two-interleaved"])}
    # scenarios, then lru, mru, trace, clairvoyant each over the best of the other real policies + 1;
    # u7-1: lru 20 and trace 12 against mru 8 + 1.
    # u7-0: mru 12 against lru 10 + 1, trace 15 against 10 + 1; clairvoyant 9 against 10 + 1.
    assert shape["two-interleaved"] == ["1", "0", "1", "1", "0"], out.stdout
    assert shape["one-off"] == ["2", "1", "0", "1", "0"], out.stdout


def test_heldout_refuses_a_set_without_a_real_policy(tmp_path):
    with open(tmp_path / "u3.csv", "w") as f:
        f.write(HELDOUT_HEADER + "3,0,u3-0-x,one-off,lru,1,1,0,1,6\n3,0,u3-0-x,one-off,trace,1,1,0,1,6\n")
    out = heldout("--seeds", "3", "--csv-dir", str(tmp_path), "--sim", str(tmp_path / "no-sim"))
    assert out.returncode != 0 and "has no ['mru'] row for u3-0-x" in out.stderr, out.stdout + out.stderr
    out = heldout("--seeds", "3", "--csv-dir", str(tmp_path), "--policies", "lru,trace")
    assert out.returncode != 0 and "--policies must name mru; got 'lru,trace'" in out.stderr, out.stderr


def test_heldout_runs_the_simulator_for_a_missing_set(tmp_path):
    out = heldout("--sim", SIM, "--seeds", "1-2", "--scenarios", "3", "--csv-dir", str(tmp_path), "--jobs", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(os.listdir(tmp_path)) == ["u1.csv", "u2.csv"], os.listdir(tmp_path)
    assert "scenarios=6 sets=2" in out.stdout, out.stdout
    with open(tmp_path / "u1.csv") as f:
        assert {r.split(",")[4] for r in f.read().splitlines()[1:]} >= {"lru", "mru", "trace", "clairvoyant"}


def test_sim_runs_csv_holds_each_run_the_suite_csv_sums(tmp_path):
    """pins-sim --runs-csv: every policy's runs, the first too, and the
    oracle's; runs 1.. sum to the --csv row, a layer a run to its allowance."""
    summary, runs = tmp_path / "u5.csv", tmp_path / "u5.runs.csv"
    out = subprocess.run([SIM, "--suite", "--suite-kind", "unseen", "--scenarios", "3", "--seed", "5", "--policy",
                          "lru,trace", "--threads", "1", "--csv", str(summary), "--runs-csv", str(runs)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    per_run = {}
    with open(runs, newline="") as f:
        for r in csv.DictReader(f):
            per_run.setdefault((r["name"], r["policy"]), []).append((int(r["run"]), int(r["disk_bytes"]),
                                                                     int(r["layer_bytes"])))
    with open(summary, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["policy"] for r in rows} == {"lru", "trace", "oracle"}
    assert len(rows) == 9 and set(per_run) == {(r["name"], r["policy"]) for r in rows}
    for r in rows:
        runs_of = per_run[(r["name"], r["policy"])]
        assert [run for run, _, _ in runs_of] == list(range(int(r["runs"]) + 1)), (r["name"], runs_of)
        assert sum(d for run, d, _ in runs_of if run > 0) == int(r["disk_bytes"]), (r["name"], r["policy"])
        assert runs_of[0][2] * int(r["runs"]) == int(r["allowance_bytes"]), r["name"]
    bad = subprocess.run([SIM, "--trace", TRACES[0], "--runs-csv", str(tmp_path / "x.csv")], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--runs-csv applies to --suite" in bad.stderr, bad.stderr


BOUNDS = os.path.join(ROOT, "profiling", "sim", "selector_bounds.py")
RUNS_HEADER = "seed,scenario,name,pattern,policy,run,disk_bytes,layer_bytes\n"


def write_runs(path, scenarios, seed=7):
    """scenarios: {name: {policy: [GiB of run 0, 1, ...]}}, a layer of 1 GiB."""
    gib = 2**30
    with open(path, "w") as f:
        f.write(RUNS_HEADER)
        for i, (name, policies) in enumerate(scenarios.items()):
            for policy, runs in policies.items():
                for run, d in enumerate(runs):
                    f.write(f"{seed},{i},{name},one-off,{policy},{run},{d * gib},{gib}\n")


def test_selector_bounds_count_each_selector_as_worked_by_hand(tmp_path):
    """Two counted runs a scenario, so a layer a run allows 2 GiB. A: trace
    and mru each lose one run (anti-correlated); every selector that follows
    the leader picks the wrong one in the second run. B: trace and mru lose to
    lru. C: all equal. The sets' CSVs exist, so nothing runs."""
    write_runs(tmp_path / "u7.runs.csv", {
        "A": {"lru": [9, 10, 10], "mru": [9, 4, 12], "trace": [9, 12, 4], "clairvoyant": [9, 8, 8],
              "oracle": [9, 3, 3]},
        "B": {"lru": [5, 3, 3], "mru": [5, 10, 10], "trace": [5, 10, 10], "clairvoyant": [5, 3, 3],
              "oracle": [5, 3, 3]},
        "C": {"lru": [4, 4, 4], "mru": [4, 4, 4], "trace": [4, 4, 4], "clairvoyant": [4, 4, 4], "oracle": [4, 2, 2]},
    })
    (tmp_path / "u7.csv").write_text(HELDOUT_HEADER)
    out = subprocess.run([sys.executable, BOUNDS, "--seeds", "7", "--csv-dir", str(tmp_path), "--sim",
                          str(tmp_path / "no-sim")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    got = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[1:-1]}
    oracle = 6 + 6 + 4
    # Line: A min(20, 16) + 2 = 18, B 6 + 2 = 8, C 10.
    # trace: A 16, B 20 (over; not over mru + 2), C 8.
    # hindsight: the lesser of trace and mru: A 16, B 20 (over).
    # leader-2: run 1 trace (a tie at 0), run 2 the lesser so far: A trace 12 then mru 12 = 24 (over, and
    # over 1.25 x 16), B 20 (over). leader-3: A the same; B trace 10, then lru 3 = 13 (over).
    # switch-R: A trace's 12 is over R x 4 + 1 for every R, so mru in run 2: 24; B never switches: 20.
    expected = {
        "trace": [1, 0, 0, 16 + 20 + 8], "clairvoyant": [0, 0, 0, 16 + 6 + 8], "hindsight": [1, 0, 0, 16 + 20 + 8],
        "leader-2": [2, 1, 1, 24 + 20 + 8], "leader-3": [2, 1, 1, 24 + 13 + 8],
        "switch-1.1": [2, 1, 1, 24 + 20 + 8], "switch-1.25": [2, 1, 1, 24 + 20 + 8],
        "switch-1.5": [2, 1, 1, 24 + 20 + 8],
    }
    assert got == {sel: [str(v) for v in e[:3]] + [f"{e[3] / oracle:.3f}"] for sel, e in expected.items()}, out.stdout
    assert out.stdout.splitlines()[-1] == "sets=1 scenarios=3", out.stdout


def test_selector_bounds_refuses_runs_out_of_order_or_a_missing_policy(tmp_path):
    (tmp_path / "u3.csv").write_text(HELDOUT_HEADER)
    write_runs(tmp_path / "u3.runs.csv", {"X": {"lru": [1, 1], "mru": [1, 1], "trace": [1, 1], "oracle": [1, 1]}}, 3)
    out = subprocess.run([sys.executable, BOUNDS, "--seeds", "3", "--csv-dir", str(tmp_path)], capture_output=True,
                         text=True)
    assert out.returncode != 0 and "has no ['clairvoyant'] rows for X" in out.stderr, out.stderr
    with open(tmp_path / "u3.runs.csv", "a") as f:
        f.write("3,0,X,one-off,clairvoyant,1,1,1\n")
    out = subprocess.run([sys.executable, BOUNDS, "--seeds", "3", "--csv-dir", str(tmp_path)], capture_output=True,
                         text=True)
    assert out.returncode != 0 and "X clairvoyant: run 1 out of order (expected 0)" in out.stderr, out.stderr
