import os
import subprocess
import sys

import torch_pins

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The library the package loads: the build for this torch's release (docs/RELEASES.md).
LIB = torch_pins.library_path()


def test_library_loads_with_torch_ops_load_library():
    # A fresh process, so nothing else has loaded it first.
    code = "import torch; torch.ops.load_library(%r); print(sorted(torch.ops.loaded_libraries))" % LIB
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "libpins.so" in out.stdout


def test_a_library_built_for_another_torch_is_refused_with_a_clear_error(tmp_path):
    import shutil

    lib = tmp_path / "libpins.so"
    shutil.copy(LIB, lib)
    (tmp_path / "libpins.so.torch").write_text("1.0.0\n")
    code = "import torch_pins"
    env = dict(os.environ, PINS_LIBRARY=str(lib), PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert "was built against torch 1.0.0, not this torch's release" in out.stderr, out.stderr
    assert "scripts/build_release.sh" in out.stderr and "carries builds for torch" in out.stderr, out.stderr


def test_a_library_built_for_another_patch_release_of_the_same_torch_loads(tmp_path):
    # The wheel requires torch==X.Y.* (python_bindings/backend/torch_release.py):
    # the import check accepts what that requirement lets pip install.
    import shutil

    import torch

    major, minor = torch.__version__.split(".")[:2]
    lib = tmp_path / "libpins.so"
    shutil.copy(LIB, lib)
    (tmp_path / "libpins.so.torch").write_text(f"{major}.{minor}.99\n")
    code = "import torch_pins as p; print(p.library_path())"
    env = dict(os.environ, PINS_LIBRARY=str(lib), PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(lib)


def test_the_package_has_one_version_shared_with_cmake(tmp_path):
    # CMakeLists.txt reads torch_pins/_version.py before project(): run those lines.
    import re

    import torch_pins

    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    head, _, rest = text.partition("\nproject(pins VERSION ${_pins_version} ")
    assert rest, "CMakeLists.txt must take project(VERSION) from torch_pins/_version.py"
    script = tmp_path / "version.cmake"
    script.write_text(head + '\nmessage("${_pins_version}")\n')
    out = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"\d+\.\d+\.\d+", torch_pins.__version__)
    assert out.stderr.strip() == torch_pins.__version__


def test_the_build_records_its_torch_version_and_variant():
    import torch

    from torch_pins import _library

    with open(LIB + ".torch") as f:
        assert f.read().strip() == torch.__version__.split("+")[0] + "+" + _library.variant()


def test_the_library_exports_the_public_api_and_nothing_else_of_pins():
    # include/pins/export.h: every entry point of include/pins/ops/ is exported
    # (an app links against them), and no other symbol of pins (the core, the
    # ops' internals) is: a second copy of the core in a process must not bind to it.
    import glob
    import re

    out = subprocess.run(["nm", "-D", "-C", "--defined-only", LIB], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    exported = {line.split(" ", 2)[2] for line in out.stdout.splitlines() if line.count(" ") >= 2}
    ours = sorted(s for s in exported if s.startswith("pins::") or " pins::" in s)
    declared = set()
    for header in glob.glob(os.path.join(ROOT, "include", "pins", "ops", "*.h")):
        declared |= set(re.findall(r"^PINS_API [^(]*?\b(\w+)\(", open(header).read(), re.M))
    assert len(declared) >= 17, declared
    names = {re.match(r"pins::ops::(\w+)", s).group(1) for s in ours if s.startswith("pins::ops::")}
    assert names == declared, (sorted(names ^ declared), ours)
    assert all(s.startswith("pins::ops::") for s in ours), [s for s in ours if not s.startswith("pins::ops::")]
