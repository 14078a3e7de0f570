"""The profiling tools agree with independent checks and keep their command-line
contract: the model parameter file is what its generator writes, the simulator's
oracle equals an independent Belady replay of its own access dump on every
bundled trace, its JSON report draws a PNG (profiling/sim/plot.py), and both
executables answer --help on stdout with status 0 and refuse unknown options.

The executables: $PINS_SIM and $PINS_BENCH, default build/bin/ of this checkout."""
import glob
import json
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
        run = subprocess.run([SIM, "--trace", trace, "--sequence", "all", "--policy", "oracle", "--runs", "4", "--json",
                              "--dump-accesses", str(dump)], stdout=f, stderr=subprocess.PIPE, text=True)
    assert run.returncode == 0, run.stderr
    assert json.load(open(result))["runs"], "no runs in the JSON"
    check = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "sim", "check_oracle.py"), str(dump),
                            str(result)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


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
                                        ([BENCH, "alloc", "--help"], "usage: pins-bench alloc")],
                         ids=["sim", "sim_h", "bench", "bench_alloc"])
def test_help_prints_usage_to_stdout_and_exits_0(args, usage):
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(usage), out.stdout
    assert out.stderr == ""


@pytest.mark.parametrize("args,message", [
    ([SIM, "--trace", "t.json", "--frobnicate"], 'pins-sim: unknown argument "--frobnicate"'),
    ([SIM, "--trace", "t.json", "--runs", "many"], 'pins-sim: --runs: expected a positive integer, got "many"'),
    ([BENCH, "frobnicate"], 'pins-bench: unknown benchmark "frobnicate"'),
    ([BENCH, "alloc", "--frobnicate"], 'pins-bench alloc: unknown option "--frobnicate"'),
    ([BENCH, "alloc", "--reps", "0"], 'pins-bench alloc: --reps: expected a positive integer, got "0"'),
], ids=["sim_unknown", "sim_runs", "bench_unknown", "bench_alloc_unknown", "bench_alloc_reps"])
def test_unknown_options_fail_with_a_message(args, message):
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.startswith(message), out.stderr
