"""Which ComfyUI runs: its version, the modules it has, and the modules it
imports later (Note [ComfyUI hook points]).

A hooked module that is not imported yet when ``enable()`` runs is imported
from here (the ``comfy.*`` ones), or awaited (``execution``: its hooks go in
when ComfyUI imports it, through an import hook on ``sys.meta_path``). A module
that fails to import is told apart from one that does not exist: its exception
is recorded and logged."""
import contextlib
import importlib
import importlib.abc
import sys
from typing import Any, Callable, Optional

from .state import Integration, current, log

# Modules whose absence is a fact of the ComfyUI release, not worth a warning.
OPTIONAL_MODULES = {"comfy.pinned_memory", "comfy.clip_vision", "comfy.bg_removal_model", "comfy.model_prefetch",
                    "nodes"}
# Modules never imported from here: ComfyUI imports them, and their hooks wait.
AWAITED_MODULES = {"execution"}
# Modules hooked only where they are imported already, never imported nor
# awaited from here: ComfyUI's ``nodes`` (importing it loads every built-in
# node); it is there before a custom node can call enable(), and an enable()
# made earlier finds it when ``execution`` arrives.
PRESENT_MODULES = {"nodes"}


def comfy_version() -> str:
    version = sys.modules.get("comfyui_version")
    if version is None:
        try:
            import comfyui_version as version  # noqa: F811  (ComfyUI's own file at its root)
        except Exception:  # noqa: BLE001
            return "unknown"
    return str(getattr(version, "__version__", "unknown"))


def import_module(state: Integration, name: str) -> Any:
    """The module, or None: absent (this ComfyUI has no such module), failed
    (recorded with its exception), or awaited."""
    module = sys.modules.get(name)
    if module is not None or name in state.failed:
        return module
    if name in AWAITED_MODULES:
        state.awaited.add(name)
        return None
    if name in PRESENT_MODULES:
        return None
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            return None  # absent
        state.failed[name] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001  (ComfyUI's module raised: record, never fatal)
        state.failed[name] = f"{type(e).__name__}: {e}"
    log.warning("pins: importing %s failed (%s); its hooks are left out", name, state.failed[name])
    return None


class _ArrivalLoader(importlib.abc.Loader):
    """Runs a module's own loader, then tells the finder's callback it arrived."""

    def __init__(self, inner: Any, arrived: Callable[[str], None]):
        self._inner = inner
        self._arrived = arrived

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._arrived(module.__name__)

    def __getattr__(self, name):  # get_source, get_code, ...: the module's own loader's
        return getattr(self._inner, name)


class ArrivalFinder(importlib.abc.MetaPathFinder):
    """On sys.meta_path while a module's hooks are awaited: calls ``arrived``
    with the module's name once it is imported."""

    _instance: Optional["ArrivalFinder"] = None

    def __init__(self, arrived: Callable[[str], None]):
        self._arrived = arrived

    @classmethod
    def install(cls, arrived: Callable[[str], None]) -> None:
        if cls._instance is None:
            cls._instance = cls(arrived)
            sys.meta_path.insert(0, cls._instance)

    @classmethod
    def remove(cls) -> None:
        if cls._instance is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(cls._instance)
            cls._instance = None

    def find_spec(self, fullname, path, target=None):
        state = current()
        if state is None or fullname not in state.awaited:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ArrivalLoader(spec.loader, self._arrived)
        return spec
