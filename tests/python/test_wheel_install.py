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


def fake_tree(path, build_type, stamp):
    path.mkdir(parents=True)
    (path / "CMakeCache.txt").write_text(f"CMAKE_BUILD_TYPE:STRING={build_type}\nOTHER:BOOL=ON\n")
    if stamp:
        (path / "lib").mkdir()
        (path / "lib" / "libpins.so.torch").write_text(stamp + "\n")
    return str(path)


def test_a_prebuilt_tree_is_taken_only_as_a_release_build_for_the_named_torch(tmp_path):
    # make test-platforms hands release.py the install check's build (--prebuilt):
    # a tree that is not a Release build of that torch release and variant must
    # be refused by name, never packed into the wheel.
    build = next(b for b in release.BUILDS if b.name == "2.13-cpu")
    with pytest.raises(SystemExit, match="no CMakeCache.txt"):
        release.prebuilt_tree(build, str(tmp_path))
    with pytest.raises(SystemExit, match="CMAKE_BUILD_TYPE is 'RelWithDebInfo'"):
        release.prebuilt_tree(build, fake_tree(tmp_path / "dev", "RelWithDebInfo", "2.13.0+cpu"))
    with pytest.raises(SystemExit, match=r"built for torch '2\.14\.1\+cu13', not the 2\.13-cpu build"):
        release.prebuilt_tree(build, fake_tree(tmp_path / "other", "Release", "2.14.1+cu13"))
    with pytest.raises(SystemExit, match=r"built for torch '\(no stamp\)'"):
        release.prebuilt_tree(build, fake_tree(tmp_path / "unstamped", "Release", ""))
    good = fake_tree(tmp_path / "good", "Release", "2.13.0+cpu")
    assert release.prebuilt_tree(build, good) == good


def test_a_prebuilt_tree_is_installed_without_building(tmp_path, monkeypatch):
    # build/ stands in for the install check's tree (its build type aside): the
    # stage gets its files, scripts/build_release.sh never runs, and the report
    # names the tree.
    if not os.path.isfile(os.path.join(BUILD, "cmake_install.cmake")):
        pytest.skip("no build/ tree here: make build makes it")
    build = next(b for b in release.BUILDS if b.name == f"{RELEASE}-{VARIANT}")
    monkeypatch.setattr(release, "prebuilt_tree", lambda b, tree: tree)
    ran = []
    real_sh = release.sh
    monkeypatch.setattr(release, "sh", lambda cmd, **kw: ran.append(cmd) or real_sh(cmd, **kw))
    stage = str(tmp_path / "stage")
    built = release.build_and_stage(build, sys.executable, stage, ["3.10", "3.12"], prebuilt=BUILD)
    assert not [c for c in ran if "scripts/build_release.sh" in c], ran
    assert built["prebuilt"] == BUILD and built["build_seconds"] == 0.0, built
    assert built["torch"].split("+")[0] == torch.__version__.split("+")[0], built
    assert os.path.isfile(os.path.join(stage, "torch_pins", "_lib", f"torch-{build.name}", "libpins.so")), built
    # A tree whose torch_pins._C is for another Python than the venv's is refused by name.
    monkeypatch.setattr(release, "torch_pythons", lambda python: ["3.11"])
    other = tmp_path / "py"
    other.write_text("#!/bin/sh\nif [ \"$1\" = -c ] && echo \"$2\" | grep -q version_info; then echo 3.9; "
                     f"else exec {sys.executable} \"$@\"; fi\n")
    other.chmod(0o755)
    with pytest.raises(SystemExit, match=r"but .*py is Python 3\.9 with torch"):
        release.build_and_stage(build, str(other), str(tmp_path / "stage2"), [], prebuilt=BUILD)
