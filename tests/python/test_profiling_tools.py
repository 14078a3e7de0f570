"""The profiling tools agree with independent checks: the model parameter file
is what its generator writes, and the simulator's oracle equals an independent
Belady replay of its own access dump on every bundled trace."""
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = os.path.join(ROOT, "build", "bin", "pins-sim")


def test_model_params_csv_is_what_the_generator_writes():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "data", "gen_model_params.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("trace", sorted(glob.glob(os.path.join(ROOT, "profiling", "traces", "*.json"))),
                         ids=os.path.basename)
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
