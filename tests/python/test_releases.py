"""One package, several torch releases (Note [One package, several torch
releases] in torch_pins/_library.py): the package loads the build of the running
torch's release and variant from _lib/torch-X.Y-VARIANT, and a torch it carries
no build for gets an ImportError that names the builds it does carry, the newest,
and the one command that builds for that torch."""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch

import torch_pins as pins
from torch_pins import _library

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python_bindings")
RELEASE = _library.release(torch.__version__)


def test_the_library_loaded_is_the_build_for_this_torchs_release():
    if os.environ.get("PINS_LIBRARY"):
        pytest.skip("PINS_LIBRARY names the library to load, so the package's choice is not used")
    path = pins.library_path()
    assert os.path.dirname(path) == _library.release_dir(torch.__version__), path
    assert os.path.basename(os.path.dirname(path)) == f"torch-{RELEASE}-{_library.variant()}", path
    stamp = _library.built_against(path)
    assert _library.release(stamp) == RELEASE and _library.stamp_variant(stamp) == _library.variant(), stamp
    assert RELEASE in _library.supported_releases()
    if pins._C is not None:  # the extension module comes from the same folder
        assert os.path.dirname(pins._C.__file__) == os.path.dirname(path)


def test_the_variant_follows_torchs_cuda_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.2")
    assert _library.variant() == "cu13"
    assert _library.release_dir("2.15.0+cu132", "/x").endswith("/x/torch-2.15-cu13")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert _library.variant() == "cpu"
    assert [_library.stamp_variant(s) for s in ("2.13.0+cpu", "2.14.1+cu13", "2.14.1", "2.14.1+cu130")] == \
        ["cpu", "cu13", None, None]


def test_carried_builds_lists_only_folders_holding_a_library(tmp_path):
    for name, lib in [("torch-2.14-cu13", True), ("torch-2.9-cpu", True), ("torch-2.13-cpu", True),
                      ("torch-2.13-cu13", True), ("torch-2.12-cu13", False), ("torch-x.y-cpu", True),
                      ("torch-2.11", True), ("notes", True)]:
        (tmp_path / name).mkdir()
        if lib:
            (tmp_path / name / "libpins.so").write_bytes(b"")
    assert _library.carried_builds(str(tmp_path)) == [("2.9", "cpu"), ("2.13", "cpu"), ("2.13", "cu13"),
                                                      ("2.14", "cu13")]  # numeric order, not text
    assert _library.supported_releases(str(tmp_path)) == ["2.9", "2.13", "2.14"]
    assert _library.supported_releases(str(tmp_path / "absent")) == []


def run_under_version(version, env_extra=None, package_dir=PACKAGE):
    """Imports torch_pins from `package_dir` only (-S: no .pth hook, such as
    the editable install's) in a fresh Python whose torch reports `version`."""
    code = ("import torch; torch.__version__ = %r\n"
            "try:\n    import torch_pins\nexcept ImportError as e:\n    print('IMPORT-ERROR', e)\n"
            "else:\n    print('LOADED', torch_pins.library_path())\n") % version
    env = dict(os.environ, PYTHONPATH=str(package_dir) + os.pathsep + sysconfig.get_paths()["purelib"])
    env.pop("PINS_LIBRARY", None)
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_unsupported_release_is_refused_naming_the_supported_ones_and_the_way_to_build():
    out = run_under_version("2.99.0+cpu")
    assert out.startswith("IMPORT-ERROR"), out
    assert f"torch 2.99.0+cpu (release 2.99, {_library.variant()})" in out, out
    assert f"the newest is {_library.supported_releases()[-1]}" in out, out
    for release in _library.supported_releases():
        assert release in out.split("carries builds for torch", 1)[1], out
    # From the source tree, the ways this repository builds.
    assert "scripts/build_release.sh" in out and "pip install --no-build-isolation" in out, out


def installed_package(tmp_path, builds):
    """The package as pip installs it (outside the source tree), carrying `builds`
    ((folder, stamp) pairs): copies of this torch's build, restamped."""
    site = tmp_path / "site"
    shutil.copytree(os.path.join(PACKAGE, "torch_pins"), site / "torch_pins",
                    ignore=shutil.ignore_patterns("__pycache__", "_lib"))
    for folder, stamp in builds:
        lib = site / "torch_pins" / "_lib" / folder
        lib.mkdir(parents=True)
        shutil.copy(pins.library_path(), lib / "libpins.so")
        (lib / "libpins.so.torch").write_text(stamp + "\n")
    return site


def test_a_torch_newer_than_every_build_names_the_builds_the_newest_and_the_one_command(tmp_path):
    # As torch 2.16 under the release wheel: every build is for an older release.
    site = installed_package(tmp_path, [("torch-2.11-cu13", "2.11.0+cu13"), ("torch-2.15-cu13", "2.15.0+cu13"),
                                        ("torch-2.13-cpu", "2.13.0+cpu"), ("torch-2.12-cu13", "2.12.1+cu13")])
    out = run_under_version("2.16.0+cu130", package_dir=site)
    assert out.startswith("IMPORT-ERROR"), out
    assert "it carries builds for torch 2.11, 2.12, 2.15 (cu13) and 2.13 (cpu); the newest is 2.15" in out, out
    from torch_pins._version import __version__

    command = f"pip install --no-build-isolation --no-deps --force-reinstall torch_pins-{__version__}.tar.gz"
    assert command in out and out.count("pip install") == 1, out
    assert "scripts/" not in out and "make build" not in out, out  # an installed package has no source tree


def test_a_build_of_the_release_for_another_variant_is_not_loaded(tmp_path):
    # A CUDA torch of a release the package carries only a CPU build of (or the
    # reverse): that build would not load (libtorch_cuda, libcudart), so none is.
    other = "cu13" if _library.variant() == "cpu" else "cpu"
    site = installed_package(tmp_path, [(f"torch-{RELEASE}-{other}", f"{RELEASE}.0+{other}")])
    out = run_under_version(torch.__version__, package_dir=site)
    assert out.startswith("IMPORT-ERROR"), out
    assert f"it carries builds for torch {RELEASE} ({other})" in out, out


def test_a_library_named_by_pins_library_for_another_release_is_refused_before_it_loads():
    # The stamp beside it says which release it is for; loading it would fail
    # with an undefined symbol (or worse, load), so the package refuses first.
    out = run_under_version("2.99.1", {"PINS_LIBRARY": pins.library_path()})
    assert out.startswith("IMPORT-ERROR"), out
    assert f"was built against torch {_library.built_against(pins.library_path())}" in out, out


def test_every_carried_build_is_stamped_with_its_own_release_and_variant():
    lib = os.path.dirname(_library.release_dir(torch.__version__))
    for release, variant in _library.carried_builds():
        stamp = _library.built_against(os.path.join(lib, f"torch-{release}-{variant}", "libpins.so"))
        assert stamp is not None and _library.release(stamp) == release, (release, stamp)
        assert _library.stamp_variant(stamp) == variant, (variant, stamp)


def test_the_cli_names_the_carried_releases():
    out = subprocess.run([sys.executable, "-m", "torch_pins", "stats"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PACKAGE), timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("releases"))
    assert RELEASE in line, line
