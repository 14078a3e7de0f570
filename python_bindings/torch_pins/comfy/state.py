"""The integration's state while it is enabled: the options of :func:`enable`,
the hooks in, the models registered, the thread-local context of a cast, the
counters of :func:`stats` and the log. One :class:`Integration` exists between
``enable()`` and ``disable()``; every hook reads it through :func:`current`
at each call, so a hook left in by another copy of a function does nothing
once the integration is off.

Note [Bookkeeping under torch.compile]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A cast hook runs inside the model's forward, which ComfyUI's TorchCompileModel
compiles: Dynamo traces the hook, and what it reads there becomes a guard of
the compiled frame. A counter read and written while tracing
(``counters['gathered'] == 37``) made every call recompile, until the frame
hit Dynamo's recompile limit and ran eagerly. So :func:`count` and
:func:`log_once` do nothing while Dynamo traces (``is_compiling()``, as
ComfyUI's own bookkeeping in ``comfy.ops.run_every_op``): the integration's
counters count the casts made eagerly, and ``pins.stats()`` (kept by the op,
in C++) counts every cast, compiled or not. Dynamo's
``reorderable_logging_functions`` would replay them after the graph, but it
drops calls made in functions Dynamo inlines, which every hook is. What a hook
reads besides (the options, a module's registration) changes only with
enable() and disable(), or with the model, and a recompile then is one
without pins too."""
import logging
import threading
import weakref
from typing import Any, Dict, List, Optional

import torch

log = logging.getLogger("torch_pins.comfy")
MASK63 = (1 << 63) - 1
MAX_BYTES = 1 << 62  # ComfyUI asks for 1e30 bytes to mean "everything"


class ModelEntry:
    """The pins model of one ComfyUI weight module (shared by a patcher's clones)."""

    def __init__(self, pins_id: int, name: str, module: torch.nn.Module):
        self.pins_id = pins_id
        self.name = name
        self.module = weakref.ref(module)
        self.finalizer: Optional[weakref.finalize] = None


class PatchContext(threading.local):
    """Set while ``cast_bias_weight`` runs a module's patch functions
    (casting.patches): the model and the patch set's signature."""
    model: int = -1
    signature: Optional[int] = None
    active: bool = False


class VbarContext(threading.local):
    """The layer ComfyUI's vbar cast asked get_pin/pin_memory about last, and
    the subset it settled on (Note [ComfyUI as pins' host]); inside ComfyUI's
    prefetch, the bytes of the layers pins served (budget, Note [One page-lock
    count]); and whether ComfyUI's own pin call runs."""
    module: Any = None
    subset: str = "weights"
    wanted: bool = False  # ComfyUI asked pin_memory for it: it would pin the layer
    layer_entry: Any = None  # the model of the layer asked about last (its lowvram patches are its)
    patch: Any = None        # the LowVramPatch asked about last, served through pins
    patch_subset: str = "patches"
    patch_tensors: Any = ()  # ids of its factors
    prefetch: bool = False
    served: int = 0
    comfy_pin: int = 0


class Integration:
    def __init__(self, options: Dict[str, Any]):
        self.options = options
        self.hooks: Dict[str, Any] = {}         # "module.attr" -> the hooks.Hook it replaced
        self.missing: List[str] = []
        self.failed: Dict[str, str] = {}        # module -> its import error
        self.awaited: set = set()               # modules whose hooks wait for their import
        self.lock = threading.RLock()
        self.entries: Dict[int, ModelEntry] = {}  # id(weight module) -> entry
        self.owner: "weakref.WeakKeyDictionary[torch.nn.Module, ModelEntry]" = weakref.WeakKeyDictionary()
        self.counters: Dict[str, int] = {}
        self.logged: set = set()
        self.patch = PatchContext()
        self.vbar = VbarContext()
        self.prompt_open = False
        self.mode = "old-loader"


_current: Optional[Integration] = None
# Held by enable(), disable() and the installs of awaited modules.
enable_lock = threading.RLock()


def count(key: str, n: int = 1) -> None:
    """Adds ``n`` to the counter ``key`` of the integration enabled now;
    nothing while Dynamo traces (Note [Bookkeeping under torch.compile])."""
    state = _current
    if state is not None and not torch.compiler.is_compiling():
        state.counters[key] = state.counters.get(key, 0) + n


def log_once(level: int, message: str) -> None:
    """Logs ``message`` the first time it comes while enabled (not while
    Dynamo traces)."""
    state = _current
    if state is not None and not torch.compiler.is_compiling() and message not in state.logged:
        state.logged.add(message)
        log.log(level, "%s", message)


def current() -> Optional[Integration]:
    """The integration while enabled, else None."""
    return _current


def set_current(state: Optional[Integration]) -> None:
    global _current
    _current = state
