"""scripts/check_layers.py, which make test runs: the checkout's folder graph has
no cycle and its core includes no torch header, and the script finds each kind of
fault in a small tree written here (a folder cycle, torch in the core, the core
including a folder above it, a source file over its line limit)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_layers.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, "--root", str(root), "--print"], capture_output=True, text=True)


def write(root, files):
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


SOUND = {
    "csrc/base/check.h": "#pragma once\n#include <string>\n",
    "csrc/config/config.h": '#include "csrc/base/check.h"\n',
    "csrc/balancer/balancer.h": '#include "csrc/config/config.h"\n#include "csrc/base/check.h"\n',
    "csrc/runtime/runtime.h": '#include "csrc/balancer/balancer.h"\n',
    "allocator/host_allocator.h": '#include <c10/core/Allocator.h>\n#include "csrc/runtime/runtime.h"\n',
    "ops/cast.cpp": '#include <pins/ops.h>\n#include "allocator/host_allocator.h"\n',
    "include/pins/ops.h": "#include <ATen/core/Tensor.h>\n",
}


def test_the_checkout_has_no_cycle_and_no_torch_in_the_core():
    out = run(ROOT)
    assert out.returncode == 0, out.stderr
    assert "csrc/runtime -> " in out.stdout and "ops -> " in out.stdout  # the graph was derived


def test_a_sound_tree_passes(tmp_path):
    write(tmp_path, SOUND)
    out = run(tmp_path)
    assert out.returncode == 0, out.stderr
    assert "csrc/runtime -> csrc/balancer" in out.stdout


def test_a_folder_cycle_fails_naming_its_edges(tmp_path):
    write(tmp_path, dict(SOUND, **{"csrc/config/config.h": '#include "csrc/runtime/runtime.h"\n'}))
    out = run(tmp_path)
    assert out.returncode == 1
    assert "folder cycle" in out.stderr
    assert "csrc/config/config.h:1 includes csrc/runtime/runtime.h" in out.stderr


@pytest.mark.parametrize("header", ["ATen/ATen.h", "c10/core/Device.h", "torch/library.h"])
def test_torch_in_the_core_fails(tmp_path, header):
    write(tmp_path, dict(SOUND, **{"csrc/balancer/eviction.cpp": f"#include <{header}>\n"}))
    out = run(tmp_path)
    assert out.returncode == 1
    assert f"core folder includes torch: csrc/balancer/eviction.cpp:1 includes {header}" in out.stderr


def test_the_core_including_the_allocator_fails(tmp_path):
    write(tmp_path, dict(SOUND, **{"csrc/balancer/balancer.cpp": '#include "allocator/host_allocator.h"\n'}))
    out = run(tmp_path)
    assert out.returncode == 1
    assert "core folder csrc/balancer includes allocator" in out.stderr


@pytest.mark.parametrize("path", ["csrc/pool/pool.cpp", "ops/cast_path.cpp", "allocator/host_allocator.cpp",
                                  "python_bindings/torch_pins/comfy/casting.py", "python_bindings/csrc/module.cpp"])
def test_a_source_file_over_the_limit_fails_naming_it(tmp_path, path):
    write(tmp_path, dict(SOUND, **{path: "//\n" * 601}))
    out = run(tmp_path)
    assert out.returncode == 1
    assert f"{path} has 601 lines, over 600" in out.stderr


def test_a_file_at_the_limit_or_outside_the_checked_folders_passes(tmp_path):
    write(tmp_path, dict(SOUND, **{"csrc/pool/pool.cpp": "//\n" * 600, "tests/csrc/pool/pool_test.cpp": "//\n" * 900,
                                   "profiling/sim/suite.cpp": "//\n" * 900}))
    out = run(tmp_path)
    assert out.returncode == 0, out.stderr
