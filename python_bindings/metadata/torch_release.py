"""The wheel's dependency on torch: the releases it carries a build for.

A dynamic-metadata provider of scikit-build-core (``[[tool.dynamic-metadata]]``
in pyproject.toml). The build runs in the installing environment
(``pip install --no-build-isolation``) and compiles against its torch; the C++
ABI of torch changes between minor releases, so the wheel requires a release it
carries a build of. With ``PINS_WHEEL_RELEASES=1`` the wheel also ships the
builds of other releases that scripts/build_release.sh put in the package
(``torch_pins/_lib/torch-X.Y``), and requires any of them:
``torch>=2.11,<2.15,!=2.12.*`` for 2.11, 2.13 and 2.14. The package picks the
build of the running torch at import (``torch_pins/_library.py``).
"""
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_LIB = os.path.join(os.path.dirname(_HERE), "torch_pins", "_lib")


def release_of(version: str) -> Tuple[int, int]:
    """(MAJOR, MINOR) of a torch version such as ``2.13.0+cpu``."""
    parts = version.split("+", 1)[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"torch_requirement: version must start with MAJOR.MINOR, got {version!r}")
    return int(parts[0]), int(parts[1])


def torch_requirement(version: str) -> str:
    """``torch==X.Y.*`` for a torch version such as ``2.13.0+cpu``."""
    major, minor = release_of(version)
    return f"torch=={major}.{minor}.*"


def requirement_for(versions: Iterable[str]) -> str:
    """The requirement a wheel carrying builds for `versions` states: one release
    is ``torch==X.Y.*``; several are their span less the releases between them
    that it lacks."""
    releases = sorted({release_of(v) for v in versions})
    if not releases:
        raise ValueError("requirement_for: needs at least one torch version, got none")
    if len(releases) == 1:
        return f"torch=={releases[0][0]}.{releases[0][1]}.*"
    (lo_major, lo_minor), (hi_major, hi_minor) = releases[0], releases[-1]
    if lo_major != hi_major:
        raise ValueError(f"requirement_for: releases must share a major version, got {releases}")
    gaps = [f"!={lo_major}.{m}.*" for m in range(lo_minor + 1, hi_minor) if (lo_major, m) not in releases]
    return ",".join([f"torch>={lo_major}.{lo_minor}", f"<{hi_major}.{hi_minor + 1}"] + gaps)


def packaged_releases(lib: str = PACKAGE_LIB) -> List[str]:
    """The releases whose build is in the package (``_lib/torch-X.Y/libpins.so``)."""
    try:
        names = os.listdir(lib)
    except OSError:
        return []
    return [m.group(1) for m in map(re.compile(r"^torch-(\d+\.\d+)$").match, sorted(names))
            if m and os.path.isfile(os.path.join(lib, m.group(0), "libpins.so"))]


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
    versions = [torch.__version__]
    if os.environ.get("PINS_WHEEL_RELEASES") == "1":
        versions += packaged_releases()
    return {"dependencies": [requirement_for(versions)]}
