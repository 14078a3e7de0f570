"""Finds and loads libpins.so into torch (once), and the extension module beside it.

Note [One package, several torch releases]
The torch layer of pins (the ops, the c10 host allocator, torch_pins._C) is
compiled against torch's C++ API, whose ABI changes between minor releases
(torch 2.11's ``torch::Library::_def`` takes ``at::Tag``, 2.13's
``torch::headeronly::Tag``), so one binary cannot load into every release; and
a build for a CUDA torch links libtorch_cuda and libcudart, which a CPU torch
lacks. The package therefore carries one build of that layer per release and
variant (``cpu``, or ``cuN`` for a torch built with CUDA N), each in
``_lib/torch-MAJOR.MINOR-VARIANT/`` (libpins.so, its ``.torch`` stamp, and
torch_pins._C once per Python version), all built from the same sources
(scripts/release.py), and picks the one of the running torch at import. A torch
it has no build for is refused, naming the builds it carries and the one command
that builds for that torch. What the stable ABI would need instead is listed in
docs/RELEASES.md.
"""
import importlib.util
import os
import re
import sys
import sysconfig
import warnings
from types import ModuleType
from typing import List, Optional, Tuple

import torch

from ._version import __version__

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_LIB = os.path.join(_HERE, "_lib")
_BUILD_DIR = re.compile(r"^torch-(\d+)\.(\d+)-([a-z]+[0-9]*)$")
_EXTENSION = re.compile(r"^_C\.cpython-(\d)(\d+)-.*\.so$")
# A source checkout (python_bindings/ beside CMakeLists.txt), not an installed package.
_SOURCE_TREE = os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(_HERE)), "CMakeLists.txt"))


def release(version: str) -> str:
    """The MAJOR.MINOR release of a torch version (``2.13.0+cpu`` -> ``2.13``): the
    C++ ABI a library is built for."""
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def variant() -> str:
    """The variant of the running torch: ``cuN`` for a build with CUDA N (its
    libcudart.so.N), ``rocmN`` for ROCm N, ``cpu`` otherwise."""
    if torch.version.cuda:
        return "cu" + torch.version.cuda.split(".")[0]
    hip = getattr(torch.version, "hip", None)
    if hip:
        return "rocm" + hip.split(".")[0]
    return "cpu"


def stamp_variant(stamp: str) -> Optional[str]:
    """The variant in a build's stamp (``2.13.0+cpu``, ``2.14.1+cu13``); None for a
    stamp that names only a version (a build made before variants)."""
    m = re.fullmatch(r"[^+]*\+(cpu|cu\d{1,2}|rocm\d+)", stamp)
    return m.group(1) if m else None


def release_dir(version: str, lib: str = _PACKAGE_LIB, build_variant: Optional[str] = None) -> str:
    """The folder of the package's ``_lib`` that holds the build for `version`'s
    release and `build_variant` (default: the running torch's)."""
    return os.path.join(lib, f"torch-{release(version)}-{build_variant or variant()}")


def carried_builds(lib: str = _PACKAGE_LIB) -> List[Tuple[str, str]]:
    """The (release, variant) builds the package carries
    (``_lib/torch-X.Y-VARIANT/libpins.so``), oldest release first."""
    try:
        names = os.listdir(lib)
    except OSError:
        return []
    found = []
    for name in names:
        m = _BUILD_DIR.match(name)
        if m and os.path.isfile(os.path.join(lib, name, "libpins.so")):
            found.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    return [(f"{major}.{minor}", v) for major, minor, v in sorted(found)]


def supported_releases(lib: str = _PACKAGE_LIB) -> List[str]:
    """The releases the package carries a build for, each once, oldest first."""
    seen: List[str] = []
    for r, _ in carried_builds(lib):
        if r not in seen:
            seen.append(r)
    return seen


def build_names(lib: str = _PACKAGE_LIB) -> List[str]:
    """The carried builds as ``X.Y-VARIANT``."""
    return [f"{r}-{v}" for r, v in carried_builds(lib)]


def candidates() -> List[str]:
    """Where :func:`library_path` looks, in order: $PINS_LIBRARY, the package's
    build for the running torch (``torch_pins/_lib/torch-X.Y-VARIANT``: the
    wheel's, or what the repository's builds copy there), the repository's
    ``build/lib``."""
    found = []
    env = os.environ.get("PINS_LIBRARY")
    if env:
        found.append(env)
    found.append(os.path.join(release_dir(torch.__version__), "libpins.so"))
    found.append(os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "lib", "libpins.so"))
    return found


def _carried(lib: str = _PACKAGE_LIB) -> str:
    """``torch 2.11, 2.12, 2.15 (cu13) and 2.13 (cpu); the newest is 2.15``."""
    builds = carried_builds(lib)
    if not builds:
        return "it carries no build of libpins.so"
    by_variant: dict = {}
    for r, v in builds:
        by_variant.setdefault(v, []).append(r)
    groups = [f"{', '.join(rs)} ({v})" for v, rs in by_variant.items()]
    return (f"it carries builds for torch {' and '.join(groups)}; the newest is "
            f"{max((r for r, _ in builds), key=lambda r: tuple(map(int, r.split('.'))))}")


def build_command() -> str:
    """The one command that builds pins for the running torch: the source
    package of this version, built in this environment."""
    return f"pip install --no-build-isolation --no-deps --force-reinstall torch_pins-{__version__}.tar.gz"


def _unsupported() -> str:
    how = (f"build it for this torch with {build_command()} (the source package of this release, from where this "
           "wheel came: it needs CMake, a C++ compiler and, for a CUDA torch, the CUDA toolkit)")
    if _SOURCE_TREE:
        how = ("build it for this torch: make build (this repository's venv), bash scripts/build_release.sh PYTHON "
               "(another venv's torch), or pip install --no-build-isolation . (a wheel of this tree)")
    return (f"pins: no libpins.so for torch {torch.__version__} (release {release(torch.__version__)}, {variant()}) in "
            f"this package: {_carried()}. Install a torch it carries, or {how}; PINS_LIBRARY names a library "
            "built elsewhere.")


def library_path() -> str:
    """The libpins.so this package loads: the first of :func:`candidates` that exists."""
    looked = candidates()
    for path in looked:
        if os.path.isfile(path):
            return path
    raise ImportError(_unsupported() + " Looked at " + ", ".join(looked) + ".")


def built_against(path: str) -> Optional[str]:
    """The torch version libpins.so at `path` was built against (from the
    ``.torch`` file the build writes beside it), or None when unknown."""
    try:
        with open(path + ".torch") as f:
            return f.read().strip() or None
    except OSError:
        return None


def load() -> str:
    path = library_path()
    if path in torch.ops.loaded_libraries:
        return path
    built = built_against(path)
    if built is not None and release(built) != release(torch.__version__):
        raise ImportError(f"pins: {path} was built against torch {built}, not this torch's release. "
                          + _unsupported())
    built_variant = stamp_variant(built or "")
    if built_variant is not None and built_variant != variant():
        raise ImportError(f"pins: {path} was built against torch {built}, a {built_variant} build, and this torch "
                          f"is a {variant()} one. " + _unsupported())
    torch.ops.load_library(path)
    return path


def extension_path(library: str) -> str:
    """Where torch_pins._C of the build that made ``library`` is: beside it, as
    the build (build/lib), its copy in the package and the wheel place it."""
    return os.path.join(os.path.dirname(library), "_C" + sysconfig.get_config_var("EXT_SUFFIX"))


def extension_pythons(directory: str) -> List[str]:
    """The Python versions a build's folder holds torch_pins._C for, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = sorted({(int(m.group(1)), int(m.group(2))) for m in map(_EXTENSION.match, names) if m})
    return [f"{major}.{minor}" for major, minor in found]


def load_extension(library: str) -> Optional[ModuleType]:
    """torch_pins._C, the fast path of cast_to_device (Note [Python fast path] in
    python_bindings/csrc/module.cpp), from beside the loaded ``library``: the
    same build, so the same torch. Call it after :func:`load`: the module finds
    the op in the dispatcher and links no libpins of its own. The module
    depends on the Python version: the wheel carries one per version torch
    supports. None, with one warning, where the build has none for this Python
    (a newer Python, a C++-only build, a library named by PINS_LIBRARY alone) or
    the one there does not load (built for another torch): the op then serves
    every cast."""
    name = __package__ + "._C"
    if name in sys.modules:
        return sys.modules[name]
    path = extension_path(library)
    python = "%d.%d" % sys.version_info[:2]
    if not os.path.isfile(path):
        others = extension_pythons(os.path.dirname(library))
        has = f"it has torch_pins._C for Python {', '.join(others)}" if others else "it has no torch_pins._C"
        warnings.warn(f"torch_pins: the fast path is off: the build in {os.path.dirname(library)} has no "
                      f"torch_pins._C for Python {python} ({has}), so cast_to_device calls the op on every cast",
                      RuntimeWarning, stacklevel=2)
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as e:
        warnings.warn(f"torch_pins: {path} does not load, so cast_to_device calls the op on every cast (the fast "
                      f"path is off): {e}", RuntimeWarning, stacklevel=2)
        return None
    sys.modules[name] = module
    return module
