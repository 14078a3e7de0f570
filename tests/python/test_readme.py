"""The README's and docs/USAGE.md's examples run: Python blocks execute in a fresh
process; the README's C++ and CMake blocks are excerpts of examples/cpp_app,
which test_torchscript_cpp builds and runs."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md")).read()
USAGE = open(os.path.join(ROOT, "docs", "USAGE.md")).read()


def blocks(lang, text=README):
    found = re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)
    # A fence opened twice reads as an empty block, and the example after it is never run.
    assert all(b.strip() for b in found), f"an empty ```{lang} block (a fence opened twice?)"
    return found


PYTHON = [pytest.param(code, id=f"README-{i}") for i, code in enumerate(blocks("python"))] + \
         [pytest.param(code, id=f"USAGE-{i}") for i, code in enumerate(blocks("python", USAGE))]


@pytest.mark.parametrize("code", PYTHON)
def test_python_examples_run(code, tmp_path):
    script = tmp_path / "example.py"  # a file: TorchScript reads the source back
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("lang,path", [("cpp", "examples/cpp_app/main.cpp"),
                                       ("cmake", "examples/cpp_app/CMakeLists.txt")])
def test_native_examples_are_excerpts_of_the_tested_app(lang, path):
    source = open(os.path.join(ROOT, path)).read()
    found = blocks(lang)
    assert found, f"README has no {lang} block"
    for block in found:
        for line in block.strip().splitlines():
            assert line.strip() in source, f"README line not in {path}: {line!r}"
