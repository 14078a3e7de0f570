"""make test's short form of the release wheel (docs/RELEASES.md): the torch
layer make build already built (build/, the torch of .venv) installed with
`cmake --install` into a stage, packed into the release wheel without CMake,
tagged by auditwheel with torch's libraries left to torch, and installed into a
fresh venv that sees .venv's torch and has no compiler, CMake or nvcc on PATH;
there it casts through torch_pins._C, hits, and `python -m torch_pins stats`
runs. The full forms (the source package built natively, the CMake package, a
C++ app, the wheel of several builds) are tests/python/test_install.py and
scripts/release.py in make test-platforms."""
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import release  # noqa: E402  (scripts/release.py: the release wheel's packing and checks)

sys.path.pop(0)
BUILD = os.path.join(ROOT, "build")
RELEASE = ".".join(torch.__version__.split("+", 1)[0].split(".")[:2])
VARIANT = "cu" + torch.version.cuda.split(".")[0] if torch.version.cuda else "cpu"


def test_the_wheel_of_this_build_installs_into_a_fresh_venv_without_a_compiler(tmp_path):
    if not os.path.isfile(os.path.join(BUILD, "cmake_install.cmake")):
        pytest.skip("no build/ tree here: make build makes it")
    if shutil.which("auditwheel", path=os.path.dirname(sys.executable)) is None:
        pytest.fail("auditwheel is not installed in this venv: make setup (python_bindings/requirements-dev.txt)")
    stage = tmp_path / "stage"
    for component in ("python", "python_extension"):
        subprocess.run(["cmake", "--install", BUILD, "--component", component, "--prefix", str(stage), "--strip"],
                       check=True, capture_output=True, text=True)
    lib = stage / "torch_pins" / "_lib"
    assert (lib / f"torch-{RELEASE}-{VARIANT}" / "libpins.so").is_file(), sorted(p.name for p in lib.rglob("*"))
    raw = release.make_wheel(ROOT, str(lib), str(tmp_path / "raw"), sys.executable)
    audited = release.audit(raw, str(tmp_path), sys.executable, release.torch_sonames([sys.executable]))
    name = os.path.basename(audited["wheel"])
    assert re.fullmatch(r"torch_pins-[0-9.]+-py3-none-manylinux_\d+_\d+_x86_64\.whl", name), name
    # Only torch's own libraries are outside the policy, none of them in the wheel.
    inside = zipfile.ZipFile(audited["wheel"]).namelist()
    assert not [n for n in inside if re.search(r"/(libtorch|libc10)[^/]*\.so", n)], inside
    checked = release.install_check(audited["wheel"], f"{RELEASE}-{VARIANT}", sys.executable, sys.executable,
                                    str(tmp_path))
    assert checked["paths"] == {"fast": 2, "forwarded": 0} and checked["hits"] == 1, checked
