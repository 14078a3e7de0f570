"""The wheel's dependency on torch: the release it is built against.

A dynamic-metadata provider of scikit-build-core (``[[tool.dynamic-metadata]]``
in pyproject.toml). The build runs in the installing environment
(``pip install --no-build-isolation``) and compiles against its torch, so the
wheel requires that torch's release, ``torch==X.Y.*``: the C++ ABI of torch
changes between minor releases. The package checks the same at import
(``torch_pins/_library.py``), and the CMake package at ``find_package(pins)``.
"""
from typing import Any, Dict, List, Mapping


def torch_requirement(version: str) -> str:
    """``torch==X.Y.*`` for a torch version such as ``2.13.0+cpu``."""
    parts = version.split("+", 1)[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"torch_requirement: version must start with MAJOR.MINOR, got {version!r}")
    return f"torch=={parts[0]}.{parts[1]}.*"


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> Dict[str, List[str]]:
    if settings:
        raise ValueError(f"torch_release: takes no settings, got {sorted(settings)}")
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(
            f"torch-pins builds against the torch of the installing environment, and the build cannot import "
            f"torch ({e}). pip's default build isolation builds in a fresh environment without it: install "
            "torch, then pip install --no-build-isolation ./python_bindings"
        ) from e
    return {"dependencies": [torch_requirement(torch.__version__)]}
