"""One package, several torch releases (Note [One package, several torch
releases] in torch_pins/_library.py): the package loads the build of the running
torch's release from _lib/torch-X.Y, and a torch it carries no build for gets an
ImportError that names the releases it does carry and how to build another."""
import os
import subprocess
import sys

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
    assert _library.release(_library.built_against(path)) == RELEASE
    assert RELEASE in _library.supported_releases()
    if pins._C is not None:  # the extension module comes from the same folder
        assert os.path.dirname(pins._C.__file__) == os.path.dirname(path)


def test_supported_releases_lists_only_folders_holding_a_library(tmp_path):
    for name, lib in [("torch-2.14", True), ("torch-2.9", True), ("torch-2.12", False), ("torch-x.y", True),
                      ("notes", True)]:
        (tmp_path / name).mkdir()
        if lib:
            (tmp_path / name / "libpins.so").write_bytes(b"")
    assert _library.supported_releases(str(tmp_path)) == ["2.9", "2.14"]  # numeric order, not text
    assert _library.supported_releases(str(tmp_path / "absent")) == []


def run_under_version(version, env_extra=None):
    """Imports torch_pins in a fresh Python whose torch reports `version`."""
    code = ("import torch; torch.__version__ = %r\n"
            "try:\n    import torch_pins\nexcept ImportError as e:\n    print('IMPORT-ERROR', e)\n"
            "else:\n    print('LOADED', torch_pins.library_path())\n") % version
    env = dict(os.environ, PYTHONPATH=PACKAGE)
    env.pop("PINS_LIBRARY", None)
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_unsupported_release_is_refused_naming_the_supported_ones_and_the_way_to_build():
    out = run_under_version("2.99.0+cpu")
    assert out.startswith("IMPORT-ERROR"), out
    carried = ", ".join(_library.supported_releases())
    assert "torch 2.99.0+cpu" in out and f"carries builds for torch {carried}" in out, out
    assert "scripts/build_release.sh" in out and "pip install --no-build-isolation" in out, out


def test_a_library_named_by_pins_library_for_another_release_is_refused_before_it_loads():
    # The stamp beside it says which release it is for; loading it would fail
    # with an undefined symbol (or worse, load), so the package refuses first.
    out = run_under_version("2.99.1", {"PINS_LIBRARY": pins.library_path()})
    assert out.startswith("IMPORT-ERROR"), out
    assert f"was built against torch {_library.built_against(pins.library_path())}" in out, out


def test_every_carried_build_is_stamped_with_its_own_release():
    lib = os.path.dirname(_library.release_dir(torch.__version__))
    for release in _library.supported_releases():
        stamp = _library.built_against(os.path.join(lib, "torch-" + release, "libpins.so"))
        assert stamp is not None and _library.release(stamp) == release, (release, stamp)


def test_the_cli_names_the_carried_releases():
    out = subprocess.run([sys.executable, "-m", "torch_pins", "stats"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PACKAGE), timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("releases"))
    assert RELEASE in line, line
