"""The build backend of torch-pins: scikit-build-core's, with a check first.

A wheel built from source compiles libpins.so and torch_pins._C against the
torch of the environment it is installed into, so it must run there, without
pip's build isolation (which would build against no torch, or a downloaded one
of another release). Where torch cannot be imported the backend says so in one
line naming the command to run, instead of a traceback from deep in the build.
The source package itself (build_sdist) and the release wheel, which packs
builds made beforehand (``PINS_WHEEL_PREBUILT=1``, scripts/release.py), need no
torch.

It serves the repository root's pyproject.toml, and python_bindings/pyproject.toml
too, which names it so that ``pip install ./python_bindings`` builds the same
project: from there it moves to the root before calling scikit-build-core.
"""
import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))  # python_bindings/backend -> the project


def _fail(message):
    # One line on stderr and exit status 1: pip prints it inside its own frame.
    print("torch-pins: " + message, file=sys.stderr, flush=True)
    raise SystemExit(1)


def _version():
    text = open(os.path.join(_ROOT, "python_bindings", "torch_pins", "_version.py")).read()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _target():
    """What the user gave pip: this source package (pip unpacks it, with its
    PKG-INFO, into a temporary folder) or a source tree (built in place)."""
    if os.path.isfile(os.path.join(_ROOT, "PKG-INFO")):
        return f"torch_pins-{_version()}.tar.gz"
    return os.getcwd()


def _enter_project():
    # python_bindings/pyproject.toml forwards here: scikit-build-core reads the
    # pyproject.toml of the working directory.
    if os.path.realpath(os.getcwd()) != os.path.realpath(_ROOT):
        os.chdir(_ROOT)


def _backend(hook):
    try:
        from scikit_build_core import build
    except ImportError:
        _fail("the build needs scikit-build-core in this environment: pip install scikit-build-core, "
              f"then pip install --no-build-isolation {_target()}")
    return getattr(build, hook)


def _needs_torch():
    if os.environ.get("PINS_WHEEL_PREBUILT", "").lower() in ("1", "true", "yes", "on"):
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        _fail("it compiles against the torch of the environment it installs into, and finds no torch here "
              "(pip builds in an isolated environment unless told not to); in the environment that has torch "
              f"run: pip install --no-build-isolation {_target()}")


def _absolute(args, kwargs):
    # The output folders pip names, resolved before the move to the project root.
    args = [os.path.abspath(a) if isinstance(a, str) else a for a in args]
    kwargs = {k: os.path.abspath(v) if isinstance(v, str) else v for k, v in kwargs.items()}
    return args, kwargs


def _wheel_hook(name):
    def hook(*args, **kwargs):
        _needs_torch()
        args, kwargs = _absolute(args, kwargs)
        _enter_project()
        return _backend(name)(*args, **kwargs)
    hook.__name__ = name
    return hook


def _sdist_hook(name):
    def hook(*args, **kwargs):
        os.environ["PINS_BUILD_HOOK"] = "sdist"  # the metadata provider then needs no torch
        args, kwargs = _absolute(args, kwargs)
        _enter_project()
        return _backend(name)(*args, **kwargs)
    hook.__name__ = name
    return hook


get_requires_for_build_wheel = _wheel_hook("get_requires_for_build_wheel")
prepare_metadata_for_build_wheel = _wheel_hook("prepare_metadata_for_build_wheel")
build_wheel = _wheel_hook("build_wheel")
get_requires_for_build_editable = _wheel_hook("get_requires_for_build_editable")
prepare_metadata_for_build_editable = _wheel_hook("prepare_metadata_for_build_editable")
build_editable = _wheel_hook("build_editable")
get_requires_for_build_sdist = _sdist_hook("get_requires_for_build_sdist")
build_sdist = _sdist_hook("build_sdist")
