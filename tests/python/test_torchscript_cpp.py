"""TorchScript round trip in a fresh process, and the C++ app built with
find_package(pins) from the build tree (test_install.py: from an installed prefix,
and the wheel)."""
import os
import subprocess
import sys

import pytest
import torch

from torchscript_caster import Caster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build")


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    import torch_pins as pins  # noqa: F401  (loads the library, so the op resolves while scripting)

    path = str(tmp_path_factory.mktemp("ts") / "caster.pt")
    torch.jit.script(Caster()).save(path)
    return path


def test_torchscript_round_trip_in_a_fresh_process(scripted):
    code = f"""
import torch
import torch_pins as pins
m = torch.jit.load({scripted!r})
model = pins.register_model("ts", "cpu")
x = torch.randn(3, 16)
want = x @ m.w
for _ in range(2):
    assert torch.equal(m(x, model), want)
s = pins.stats()
assert s["hits"] == 1 and s["misses"] == 1, dict(s)
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cpp_app_with_find_package(scripted):
    app_build = os.path.join(BUILD, "examples", "cpp_app")
    prefix = torch.utils.cmake_prefix_path
    cfg = subprocess.run(["cmake", "-S", os.path.join(ROOT, "examples", "cpp_app"), "-B", app_build, "-G", "Ninja",
                          f"-Dpins_DIR={BUILD}", f"-DCMAKE_PREFIX_PATH={prefix}"], capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    build = subprocess.run(["cmake", "--build", app_build], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([os.path.join(app_build, "pins_cpp_app"), scripted], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("pins_cpp_app: ok hits=2 misses=2 pins=2"), run.stdout

