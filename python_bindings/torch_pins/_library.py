"""Finds and loads libpins.so into torch (once)."""
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    """The libpins.so this package loads: $PINS_LIBRARY, else the copy shipped in
    the package (``pins/_lib``), else the repository's ``build/lib``."""
    candidates = []
    env = os.environ.get("PINS_LIBRARY")
    if env:
        candidates.append(env)
    candidates.append(os.path.join(_HERE, "_lib", "libpins.so"))
    candidates.append(os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "lib", "libpins.so"))
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise ImportError(
        "pins: libpins.so not found; looked at " + ", ".join(candidates)
        + ". Build it (make build) or set PINS_LIBRARY."
    )


def built_against(path):
    """The torch version libpins.so at `path` was built against (from the
    ``.torch`` file the build writes beside it), or None when unknown."""
    try:
        with open(path + ".torch") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _release(version):
    return version.split("+", 1)[0]


def load():
    path = library_path()
    if path in torch.ops.loaded_libraries:
        return path
    built = built_against(path)
    if built is not None and _release(built) != _release(torch.__version__):
        raise ImportError(
            f"pins: {path} was built against torch {built}, but this is torch {torch.__version__}; "
            "rebuild it (make build) against this torch"
        )
    torch.ops.load_library(path)
    return path
