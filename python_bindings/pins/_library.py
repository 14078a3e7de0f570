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


def load():
    path = library_path()
    if path not in torch.ops.loaded_libraries:
        torch.ops.load_library(path)
    return path
