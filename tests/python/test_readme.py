"""The README's examples run: Python blocks execute in a fresh process; the C++
and CMake blocks are excerpts of examples/cpp_app, which test_torchscript_cpp
builds and runs."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md")).read()


def blocks(lang):
    return re.findall(r"```" + lang + r"\n(.*?)```", README, re.S)


@pytest.mark.parametrize("code", blocks("python"))
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
