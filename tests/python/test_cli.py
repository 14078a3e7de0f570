"""`python -m torch_pins` in the repository's checkout (test_install.py runs it
from the wheel, where the simulator is absent)."""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = os.path.join(ROOT, "build", "bin", "pins-sim")
TRACE = os.path.join(ROOT, "profiling", "traces", "sdxl_refiner_16g_ram_8g_vram.json")


# The venv's packages (torch) without its .pth files: an editable install of
# torch_pins there is a meta path finder, consulted before PYTHONPATH, that would
# import its own checkout's package whatever PYTHONPATH names.
SITE = os.pathsep.join(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))


def cli(*args, module=True, package_dir=os.path.join(ROOT, "python_bindings"), **env):
    """`python -m torch_pins ARGS` importing torch_pins from `package_dir` only."""
    full = dict(os.environ, PYTHONPATH=package_dir + os.pathsep + SITE)
    for k in ("PINS_SIM", "PINS_BENCH", "PINS_CONF"):
        full.pop(k, None)
    full.update(env)
    command = ["-m", "torch_pins"] if module else []
    return subprocess.run([sys.executable, "-S", *command, *args], capture_output=True, text=True, env=full,
                          cwd=ROOT)


def test_the_cli_under_test_is_this_checkouts():
    """Every test here runs `python -m torch_pins` with this checkout's
    python_bindings first on the path and no .pth hook (SITE)."""
    out = cli("-c", "import torch_pins.__main__ as m; print(m.__file__)", module=False)
    assert out.stdout.strip() == os.path.join(ROOT, "python_bindings", "torch_pins", "__main__.py"), out.stdout


@pytest.mark.parametrize("args", [["--help"], ["stats", "--help"], ["simulate", "--help"], ["demo", "--help"]])
def test_help_exits_0(args):
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m torch_pins")


@pytest.mark.parametrize("args", [[], ["bogus"], ["stats", "--bogus"]])
def test_usage_errors_exit_2(args):
    out = cli(*args)
    assert out.returncode == 2
    assert "usage: python -m torch_pins" in out.stderr


def test_version():
    import torch_pins

    out = cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"torch-pins {torch_pins.__version__}"


def test_stats_of_a_fresh_process_shows_configuration_backend_and_counters():
    out = cli("stats", PINS_CONF="backend:null,policy:lru")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("torch-pins ")
    assert "PINS_CONF  backend:null,policy:lru" in lines
    assert "backend    null" in lines
    assert any(line.split()[:2] == ["hits", "0"] for line in lines), out.stdout
    out = cli("stats", "--json")
    s = json.loads(out.stdout)
    assert s["PINS_CONF"] == "" and s["counters"]["pins"] == 0 and s["counters"][f"backend.{s['backend']}"] == 1


def _config_lines(stdout):
    """The `key value (source)` lines of `stats`, as {key: (value, source)}."""
    lines = stdout.splitlines()
    start = lines.index("configuration: key, value (sizes in bytes), where it came from") + 1
    config = {}
    for line in lines[start:]:
        if not line:
            break
        m = re.fullmatch(r"(\S+) +(\S+) \((.+)\)", line)
        assert m, line
        config[m.group(1)] = (m.group(2), m.group(3))
    return config


def _meminfo_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def test_stats_prints_every_key_with_its_value_and_source(tmp_path):
    """One `key value (source)` line per key: PINS_CONF's keys say PINS_CONF,
    headroom and pin_reserve are derived from the machine (Note [Derived
    budget]) unless PINS_CONF sets them, the rest are defaults."""
    out = cli("stats", PINS_CONF="backend:null,policy:lru,pin_reserve:300M")
    assert out.returncode == 0, out.stderr
    config = _config_lines(out.stdout)
    import torch_pins
    keys = list(torch_pins.config())  # this process's keys, in config()'s order
    assert list(config) == keys
    assert config["backend"] == ("null", "PINS_CONF")
    assert config["policy"] == ("lru", "PINS_CONF")
    assert config["pin_reserve"] == (str(300 << 20), "PINS_CONF")
    assert config["monitor"] == ("true", "default")
    headroom, source = config["headroom"]
    assert re.fullmatch(r"derived from the machine: (RAM|cgroup limit) \d+\.\d\d GiB", source), source
    total = _meminfo_total()
    if total is not None and source.startswith("RAM"):
        gib = total / (1 << 30)
        assert source == f"derived from the machine: RAM {gib:.2f} GiB"
        want = min(max(total // 16, 1 << 30), 4 << 30, total // 4) // (1 << 20) * (1 << 20)
        assert int(headroom) == want
    for key, (_, source) in config.items():
        if key not in ("backend", "policy", "pin_reserve", "headroom"):
            assert source == "default", (key, source)

    # Set by PINS_CONF: said so; pin_reserve, unset, is the machine's.
    out = cli("stats", PINS_CONF="backend:null,headroom:3G")
    config = _config_lines(out.stdout)
    assert config["headroom"] == (str(3 << 30), "PINS_CONF")
    assert config["pin_reserve"][1].startswith("derived from the machine: ")
    assert int(config["pin_reserve"][0]) == int(headroom) // 2

    # A system root whose meminfo says 16 GiB: headroom 1 GiB, pin_reserve 512 MiB.
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(f"MemTotal: {16 << 20} kB\nMemAvailable: {12 << 20} kB\n")
    out = cli("stats", PINS_CONF=f"backend:null,system_root:{tmp_path}")
    config = _config_lines(out.stdout)
    assert config["headroom"] == (str(1 << 30), "derived from the machine: RAM 16.00 GiB")
    assert config["pin_reserve"] == (str(512 << 20), "derived from the machine: RAM 16.00 GiB")

    out = cli("stats", "--json", PINS_CONF="backend:null")
    s = json.loads(out.stdout)
    assert s["config"]["backend"] == {"value": "null", "source": "PINS_CONF"}
    assert s["config"]["headroom"]["source"].startswith("derived from the machine: ")
    assert set(s["config"]) == set(keys)


@pytest.mark.skipif(not os.path.exists(SIM), reason="build/bin/pins-sim not built")
def test_simulate_runs_pins_sim_with_the_arguments_given():
    out = cli("simulate", "--trace", TRACE, "--policy", "mru", "--runs", "1", "--json")
    assert out.returncode == 0, out.stderr
    json.loads(out.stdout)
    out = cli("simulate", "--", "--runs", "0")  # pins-sim's own usage error and status
    assert out.returncode == 2 and "--runs: expected a positive integer" in out.stderr


def test_simulate_and_demo_name_the_tool_they_cannot_find(tmp_path):
    out = cli("simulate", "--trace", TRACE, PINS_SIM="/nonexistent/pins-sim")
    assert out.returncode == 2
    assert "pins-sim not found (looked at $PINS_SIM=/nonexistent/pins-sim, not an executable file)" in out.stderr
    # demo looks for pins-sim before it writes a byte of its model files
    out = cli("demo", "--out", str(tmp_path), PINS_SIM="/nonexistent/pins-sim")
    assert out.returncode == 2
    assert "pins-sim not found (looked at $PINS_SIM=/nonexistent/pins-sim, not an executable file)" in out.stderr
    assert not os.path.exists(os.path.join(tmp_path, "models"))


def test_demo_runs_the_checkouts_demo_with_its_arguments():
    out = cli("demo", "--policy", "fifo")
    assert out.returncode == 2
    assert "demo: --policy: unknown policy 'fifo'" in out.stderr
    out = cli("demo", "--", "--help")
    assert out.returncode == 0 and "--ram-budget" in out.stdout
    assert out.stdout.startswith("usage: profiling/demo/demo.py"), out.stdout


def test_demo_outside_a_checkout_says_it_is_part_of_the_source_tree(tmp_path):
    # The package where a wheel puts it: a directory with no profiling/demo above it.
    package = os.path.join(ROOT, "python_bindings", "torch_pins")
    site = tmp_path / "site-packages"
    shutil.copytree(package, site / "torch_pins", ignore=shutil.ignore_patterns("__pycache__", "_lib"))
    os.symlink(os.path.join(package, "_lib"), site / "torch_pins" / "_lib")
    # A bad option: a demo reached by mistake stops at once (exit 2) instead of replaying.
    out = cli("demo", "--policy", "fifo", "--out", str(tmp_path / "out"), package_dir=str(site))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"demo not found (looked at {tmp_path / 'profiling' / 'demo' / 'demo.py'})" in out.stderr, out.stderr
    assert "part of the source tree" in out.stderr and "`make demo` in a clone" in out.stderr, out.stderr
    assert not os.path.exists(tmp_path / "out")
