"""The wheel's dependency on torch: the releases it carries a build for.

A dynamic-metadata provider of scikit-build-core (``[[tool.dynamic-metadata]]``
in pyproject.toml), in three cases:

- a wheel built from source (``pip install --no-build-isolation``) compiles
  against the torch of the installing environment, whose C++ ABI changes
  between minor releases: it requires that release, ``torch==X.Y.*``;
- the release wheel (``PINS_WHEEL_PREBUILT=1``, scripts/release.py) packs the
  builds staged in ``torch_pins/_lib/torch-X.Y-VARIANT`` and requires any of
  their releases: ``torch>=2.11,<2.16`` for 2.11 to 2.15;
- the source package (``PINS_BUILD_HOOK=sdist``, set by pins_build.py) builds
  against any release from the oldest the sources support.

The package picks the build of the running torch at import (``torch_pins/_library.py``).
"""
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_LIB = os.path.join(os.path.dirname(_HERE), "torch_pins", "_lib")
# The oldest torch release the sources build against and are tested with (docs/RELEASES.md).
OLDEST_RELEASE = "2.11"
_BUILD_DIR = re.compile(r"^torch-(\d+\.\d+)-[a-z0-9]+$")


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


def packaged_releases(lib: Optional[str] = None) -> List[str]:
    """The releases whose build is in the package (``_lib/torch-X.Y-VARIANT/libpins.so``), each once."""
    lib = lib or PACKAGE_LIB
    try:
        names = os.listdir(lib)
    except OSError:
        return []
    found = {m.group(1) for m in map(_BUILD_DIR.match, names)
             if m and os.path.isfile(os.path.join(lib, m.group(0), "libpins.so"))}
    return sorted(found, key=release_of)


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> Dict[str, List[str]]:
    if settings:
        raise ValueError(f"torch_release: takes no settings, got {sorted(settings)}")
    if os.environ.get("PINS_BUILD_HOOK") == "sdist":
        return {"dependencies": [f"torch>={OLDEST_RELEASE}"]}
    if _truthy("PINS_WHEEL_PREBUILT"):
        releases = packaged_releases()
        if not releases:
            raise ValueError(f"torch_release: PINS_WHEEL_PREBUILT=1 packs the builds in {PACKAGE_LIB}, which holds none")
        return {"dependencies": [requirement_for(releases)]}
    try:
        import torch
    except ImportError as e:  # pins_build.py checks first; this is for other front ends
        raise RuntimeError(f"torch-pins builds against the torch of the installing environment and cannot import "
                           f"torch ({e}): pip install --no-build-isolation in the environment that has torch") from e
    return {"dependencies": [torch_requirement(torch.__version__)]}


def dynamic_wheel(settings: Mapping[str, Any]) -> Dict[str, bool]:
    """The source package's requirement is not its wheel's (that names one
    release): PKG-INFO marks it ``Dynamic``, so no installer takes it from there."""
    return {"dependencies": True}
