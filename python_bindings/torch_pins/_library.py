"""Finds and loads libpins.so into torch (once), and the extension module beside it.

Note [One package, several torch releases]
The torch layer of pins (the ops, the c10 host allocator, torch_pins._C) is
compiled against torch's C++ API, whose ABI changes between minor releases
(torch 2.11's ``torch::Library::_def`` takes ``at::Tag``, 2.13's
``torch::headeronly::Tag``), so one binary cannot load into every release. The
package therefore carries one build of that layer per release, each in
``_lib/torch-MAJOR.MINOR/`` (libpins.so, its ``.torch`` stamp, _C), all built
from the same sources (scripts/build_release.sh), and picks the one of the
running torch at import. What the stable ABI would need instead is listed in
docs/RELEASES.md.
"""
import importlib.util
import os
import re
import sys
import sysconfig
import warnings
from types import ModuleType
from typing import List, Optional

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_LIB = os.path.join(_HERE, "_lib")
_RELEASE_DIR = re.compile(r"^torch-(\d+)\.(\d+)$")


def release(version: str) -> str:
    """The MAJOR.MINOR release of a torch version (``2.13.0+cpu`` -> ``2.13``): the
    C++ ABI a library is built for, and the folder of the package that holds it."""
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def release_dir(version: str, lib: str = _PACKAGE_LIB) -> str:
    """The folder of the package's ``_lib`` that holds the build for `version`'s release."""
    return os.path.join(lib, "torch-" + release(version))


def supported_releases(lib: str = _PACKAGE_LIB) -> List[str]:
    """The releases the package carries a build for (``_lib/torch-X.Y/libpins.so``), oldest first."""
    try:
        names = os.listdir(lib)
    except OSError:
        return []
    found = []
    for name in names:
        m = _RELEASE_DIR.match(name)
        if m and os.path.isfile(os.path.join(lib, name, "libpins.so")):
            found.append((int(m.group(1)), int(m.group(2))))
    return [f"{major}.{minor}" for major, minor in sorted(found)]


def candidates() -> List[str]:
    """Where :func:`library_path` looks, in order: $PINS_LIBRARY, the package's
    build for the running torch (``torch_pins/_lib/torch-X.Y``: the wheel's, or
    what the repository's builds copy there), the repository's ``build/lib``."""
    found = []
    env = os.environ.get("PINS_LIBRARY")
    if env:
        found.append(env)
    found.append(os.path.join(release_dir(torch.__version__), "libpins.so"))
    found.append(os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "lib", "libpins.so"))
    return found


def _unsupported() -> str:
    carried = supported_releases()
    have = ("this package carries builds for torch " + ", ".join(carried)) if carried else \
        "this package carries no build of libpins.so"
    return (f"pins: no libpins.so for torch {torch.__version__} (release {release(torch.__version__)}); {have}. "
            "Install a torch the package supports, or build pins for this one: make build (in this "
            "repository's venv), bash scripts/build_release.sh PYTHON (another venv's torch), or "
            "pip install --no-build-isolation ./python_bindings; PINS_LIBRARY names a library built elsewhere.")


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
    torch.ops.load_library(path)
    return path


def extension_path(library: str) -> str:
    """Where torch_pins._C of the build that made ``library`` is: beside it, as
    the build (build/lib), its copy in the package and the wheel place it."""
    return os.path.join(os.path.dirname(library), "_C" + sysconfig.get_config_var("EXT_SUFFIX"))


def load_extension(library: str) -> Optional[ModuleType]:
    """torch_pins._C, the fast path of cast_to_device (Note [Python fast path] in
    python_bindings/csrc/module.cpp), from beside the loaded ``library``: the
    same build, so the same torch. Call it after :func:`load`: the module finds
    the op in the dispatcher and links no libpins of its own. None where that
    build made no module (a C++-only build, no Python headers, a copy of the
    library alone); a module that is there but does not load (built for another
    torch) warns and is not used. Either way the op then serves every cast."""
    name = __package__ + "._C"
    if name in sys.modules:
        return sys.modules[name]
    path = extension_path(library)
    if not os.path.isfile(path):
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as e:
        warnings.warn(f"torch_pins: {path} does not load, so cast_to_device calls the op on every cast: {e}",
                      RuntimeWarning, stacklevel=2)
        return None
    sys.modules[name] = module
    return module
