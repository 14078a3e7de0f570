"""Finds and loads libpins.so into torch (once), and the extension module beside it."""
import importlib.util
import os
import sys
import sysconfig
import warnings
from types import ModuleType
from typing import List, Optional

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def candidates() -> List[str]:
    """Where :func:`library_path` looks, in order: $PINS_LIBRARY, the copy shipped
    in the package (``torch_pins/_lib``: the wheel's, or the one the repository's
    build copies there), the repository's ``build/lib``."""
    found = []
    env = os.environ.get("PINS_LIBRARY")
    if env:
        found.append(env)
    found.append(os.path.join(_HERE, "_lib", "libpins.so"))
    found.append(os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "lib", "libpins.so"))
    return found


def library_path() -> str:
    """The libpins.so this package loads: the first of :func:`candidates` that exists."""
    looked = candidates()
    for path in looked:
        if os.path.isfile(path):
            return path
    raise ImportError(
        "pins: libpins.so not found; looked at " + ", ".join(looked)
        + ". Build it (make build), install the wheel (pip install --no-build-isolation ./python_bindings) "
        "or set PINS_LIBRARY."
    )


def built_against(path: str) -> Optional[str]:
    """The torch version libpins.so at `path` was built against (from the
    ``.torch`` file the build writes beside it), or None when unknown."""
    try:
        with open(path + ".torch") as f:
            return f.read().strip() or None
    except OSError:
        return None


def release(version: str) -> str:
    """The MAJOR.MINOR release of a torch version (``2.13.0+cpu`` -> ``2.13``): the
    C++ ABI a library is built for, and what the wheel pins (``torch==2.13.*``)."""
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def load() -> str:
    path = library_path()
    if path in torch.ops.loaded_libraries:
        return path
    built = built_against(path)
    if built is not None and release(built) != release(torch.__version__):
        raise ImportError(
            f"pins: {path} was built against torch {built}, but this is torch {torch.__version__}; "
            "rebuild it (make build, or reinstall the wheel) against this torch"
        )
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
