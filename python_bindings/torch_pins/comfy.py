"""Plug pins into ComfyUI: ``torch_pins.comfy.enable()``.

Call it once, in ComfyUI's own Python environment (a file in ``custom_nodes/``
does it at start-up; README "ComfyUI" shows one). It replaces a few functions of
the running ComfyUI with wrappers that call the original and pins around it, and
:func:`disable` puts the originals back, so that ComfyUI then runs exactly as
without pins. ``PINS_COMFY=0`` in the environment makes :func:`enable` a no-op.

Note [ComfyUI as pins' host]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
pins is the one pinning backend of the ComfyUI it is enabled in: every weight
of a model ComfyUI loads is pinned once, by pins, within pins' budget, and
ComfyUI's own pinning stands aside for those models. ComfyUI casts in one of
two modes, and pins serves both (a process can hold models of both kinds):

- Dynamic VRAM (the default on NVIDIA in ComfyUI 0.33, ``comfy-aimdo``;
  ``comfy.memory_management.aimdo_enabled``): models are
  ``ModelPatcherDynamic`` and cast through ``comfy.ops.cast_modules_with_vbar``
  (the prefetcher calls it too), which asks ``comfy.pinned_memory.get_pin`` for
  a pin of the layer (subset ``weights`` or ``weights-loaded``), makes one with
  ``pin_memory`` and copies with ``comfy.model_management.cast_to_gathered``.
  For a layer of a registered model ``get_pin`` and ``pin_memory`` answer
  "no pin" (remembering the layer and the subset for this thread) and
  ``cast_to_gathered`` copies the layer's weight and bias into ComfyUI's
  destination (its vbar or cast buffer) through pins, with ``out=`` on the
  stream ComfyUI chose, ``resident`` for ``-loaded``. So no aimdo host buffer
  is made for it and ComfyUI's pin accounting (``TOTAL_PINNED_MEMORY``) stays
  at what it pins itself. Lowvram LoRA patches (``LowVramPatch`` sources) and
  unregistered modules keep ComfyUI's own path.
- The old loader (``--disable-dynamic-vram``, other GPUs, ComfyUI before the
  seed): ``comfy.ops.cast_bias_weight`` serves a registered module's weight and
  bias through pins, on ComfyUI's offload stream when the caller is
  ``offloadable`` (the returned triple goes to ``uncast_bias_weight`` as
  ComfyUI's would); ``ModelPatcher.pin_weight_to_device``, which page-locks an
  offloaded weight in place, does nothing for a registered model (counted
  ``declined_pins``): pins' pin is its one pinned copy.

One budget: ComfyUI's pin eviction (``free_pins(size, evict_active, loaded)``,
the tiers its RAM-pressure check and ``ensure_pin_budget`` walk) frees pins' pins
along the same tiers first (``loaded`` keeps the prompt's streaming pins, as
ComfyUI's tiers do) and ComfyUI's own after; its page-lock cap
(``ensure_pin_registerable``) counts pins' page-locked bytes with its own;
``free_memory`` frees pins for RAM it is asked for (``ram_required``, or a CPU
device), not for a page-lock request (``pins_required``: ComfyUI's
``ensure_pin_budget`` weighs that one). ComfyUI's RAM-cache release
(``extra_ram_release``) is its own: pins does not give way to it.

Boundaries come from ComfyUI's own tracking where it has it: the prompt from
``comfy.model_patcher.PromptModelTracker`` (start, the models it adds, end), a
node's end from ``comfy.model_management.reset_cast_buffers`` under dynamic
VRAM; the executor (``PromptExecutor.execute_async``, ``execution.execute``)
where it does not. ``load_models_gpu`` marks the models it loads as in the
prompt and active (which wakes pins' prewarm while ComfyUI loads them); ``LoadedModel.model_unload`` marks an unloaded model
inactive (its pins stay: the cache it reloads from); ``unload_all_models`` (the
``/free`` endpoint) marks every model inactive and frees every pin.

Note [ComfyUI hook points]
~~~~~~~~~~~~~~~~~~~~~~~~~~
Each hook is looked up by name and installed where the running ComfyUI has it.
A module that is not imported yet when :func:`enable` runs is imported from here
(the ``comfy.*`` ones), or awaited (``execution``: its hooks go in when ComfyUI
imports it, through an import hook). A module that fails to import is told apart
from one that does not exist: its exception is logged. :func:`enable` logs one
INFO line (version, mode, hooks, policy and budget) and returns a
:class:`Hooks`: the names of the hooks in, with ``missing`` (absent here),
``failed`` (modules that raised), ``awaited``, and ``active``, false (and a
warning says why) when the hooks that make pins serve casts are missing. What
each hook does:

- ``comfy.model_patcher.ModelPatcher.__init__`` (clones run it too): register a
  pins model for the patcher's ``model`` (the ``torch.nn.Module`` that holds the
  weights; clones share it, so they share the pins model), named after the
  module's class (``SDXL``, ``AutoencoderKL``), with the patcher's
  ``load_device`` and ``model_size()`` (what pins' prewarm commits ahead of
  the model's first prompt; DESIGN.md "Prewarm"). It is forgotten when that
  module is garbage collected (``weakref.finalize``), not when one clone dies.
- The cast paths of Note [ComfyUI as pins' host]: ``comfy.ops.cast_bias_weight``;
  ``comfy.pinned_memory.get_pin`` / ``pin_memory`` and
  ``comfy.model_management.cast_to_gathered``. In ``cast_bias_weight`` weight and
  bias of a registered module go through pins, in one gathered pin and one
  transfer when they share a dtype (``cast_many_to_device``), else one cast
  each; wrapper subclasses (``QuantizedTensor``) through ``_subclass`` (Note
  [Wrapper subclasses]). The module's ``weight_function``/``bias_function``
  (lowvram LoRA patches) then run on the result as in ComfyUI. The original
  serves everything else, counted by reason under ``fallback.<reason>``.
- ``comfy.model_management.cast_to_device``, which LoRA patches call to bring
  their factors to the weight's device: inside a patch function run by
  ``cast_bias_weight``, factors go through pins with ``kind="patches"``,
  ``resident`` (so they land in ``patches-loaded`` and stay across nodes and
  prompts while the patch set is unchanged, within the budget) and the patch
  set's signature: the patched model's ``current_weight_patches_uuid`` (ComfyUI
  renews it whenever the patch set changes), else a hash of the patch list.
- Boundaries and unloads, as Note [ComfyUI as pins' host] says.
- Writes of weights that bypass the version counter (``.data``; and inference
  tensors have none): ``comfy.utils.copy_to_param`` and
  ``ModelPatcher.patch_weight_to_device`` / ``patch_hook_weight_to_device``:
  ``pins.invalidate`` on the written tensor afterwards. Writes no hook sees are
  left to the content check on a hit, if configured, and to ``pins.invalidate``.
- RAM pressure: ``free_memory``, ``free_pins``, ``ensure_pin_registerable``.
- Loading (``enable(load_files=False)`` leaves it to ComfyUI):
  ``comfy.utils.load_torch_file``, which reads every checkpoint, UNet, CLIP,
  VAE, LoRA, ControlNet and upscale model file ComfyUI loads (under dynamic
  VRAM it reads safetensors with ``comfy.utils.load_safetensors``, called only
  from there, so one hook covers both modes), and the copies of it that
  ``comfy.clip_vision`` and ``comfy.bg_removal_model`` took by name at import.
  A safetensors file (``.safetensors`` or ``.sft``, ComfyUI's test) loaded to
  the CPU is read with ``pins.load_file``: CPU tensors over a private mapping
  pins knows, so a pin of one is filled from the file (O_DIRECT), not through
  a second copy in the page cache. Under dynamic VRAM ComfyUI assigns them to
  the model as its weights; the old loader copies them into the model's own
  (then only what it keeps as loaded, LoRA factors, is filled from the file).
  The result is ComfyUI's: the same keys in its order (safe_open's sorted keys,
  the header's under dynamic VRAM), dtypes, shapes and values, and with
  ``return_metadata`` the header's ``__metadata__`` (read here: an 8-byte
  little-endian length, then JSON), None without one (``{}`` under dynamic
  VRAM, as there). ComfyUI's own loader reads the rest, counted under
  ``load_fallback.<reason>``: other files (``torch.load``, where ``safe_load``
  and ``--mmap-torch-files`` act), another ``device``, ``--disable-mmap`` on
  the old loader, a file ``pins.load_file`` refuses (a dtype without a torch
  type, malformed, unreadable) and, under dynamic VRAM, one with a dtype
  ``load_safetensors`` has no type for (``comfy.utils._TYPES``): the user gets
  ComfyUI's result or its error.
  Not reached: code that took ``load_torch_file`` by name before :func:`enable`
  (a custom node's ``from comfy.utils import load_torch_file``) and direct
  ``safetensors`` calls (text-encoder embeddings, latents). Under dynamic VRAM
  these tensors carry no comfy-aimdo file slice: what ComfyUI casts from them
  itself (lowvram LoRA patches, modules pins does not serve) is copied through
  the mapping rather than read from the file, and the mapping is not bounced
  at a node's end.

Errors from pins in a cast are not ComfyUI's: the cast falls back to the
original, the error is counted (``errors``) and logged once per message.
"""
import contextlib
import functools
import importlib
import importlib.abc
import inspect
import json
import logging
import os
import struct
import sys
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

import torch_pins as pins

from . import _subclass

__all__ = ["enable", "disable", "enabled", "is_enabled", "stats", "model_id", "Hooks", "ENV_VAR"]

ENV_VAR = "PINS_COMFY"
_log = logging.getLogger("torch_pins.comfy")
_MASK63 = (1 << 63) - 1
_MAX_BYTES = 1 << 62  # ComfyUI asks for 1e30 bytes to mean "everything"


class Hooks(frozenset):
    """What :func:`enable` installed: the names of the hooks in (``module.attr``
    or ``module.Class.attr``), and

    - ``active``: the hooks that make pins serve casts are in (its truth value);
    - ``mode``: ``"dynamic-vram"`` or ``"old-loader"`` (ComfyUI's, at enable time);
    - ``missing``: hook points this ComfyUI does not have;
    - ``failed``: modules that raised on import, with the exception's text;
    - ``awaited``: modules not imported yet, whose hooks go in when they are;
    - ``reason``: why not active (empty when active)."""

    active: bool = False
    mode: str = ""
    missing: Tuple[str, ...] = ()
    failed: Dict[str, str] = {}
    awaited: Tuple[str, ...] = ()
    reason: str = ""

    def __bool__(self) -> bool:
        return self.active

    def __repr__(self) -> str:
        return (f"Hooks(active={self.active}, mode={self.mode!r}, in={sorted(self)}, missing={list(self.missing)}, "
                f"failed={self.failed}, awaited={list(self.awaited)})")


class _Hook:
    """One attribute replaced on a module or class, and how to put it back."""

    def __init__(self, owner: Any, name: str, original: Any, had_own: bool):
        self.owner, self.name, self.original, self.had_own = owner, name, original, had_own

    def restore(self) -> None:
        if self.had_own:
            setattr(self.owner, self.name, self.original)
        else:  # the original was inherited: drop ours so lookup finds it again
            delattr(self.owner, self.name)


class _ModelEntry:
    """The pins model of one ComfyUI weight module (shared by a patcher's clones)."""

    def __init__(self, pins_id: int, name: str, module: torch.nn.Module):
        self.pins_id = pins_id
        self.name = name
        self.module = weakref.ref(module)
        self.finalizer: Optional[weakref.finalize] = None


class _PatchContext(threading.local):
    model: int = -1
    signature: Optional[int] = None
    active: bool = False


class _VbarContext(threading.local):
    """The layer ComfyUI's vbar cast asked get_pin/pin_memory about last, and
    the subset it settled on (Note [ComfyUI as pins' host])."""
    module: Any = None
    subset: str = "weights"


class _Integration:
    def __init__(self, options: Dict[str, Any]):
        self.options = options
        self.hooks: Dict[str, _Hook] = {}       # "module.attr" -> what it replaced
        self.missing: List[str] = []
        self.failed: Dict[str, str] = {}        # module -> its import error
        self.awaited: set = set()               # modules whose hooks wait for their import
        self.lock = threading.RLock()
        self.entries: Dict[int, _ModelEntry] = {}  # id(weight module) -> entry
        self.owner: "weakref.WeakKeyDictionary[torch.nn.Module, _ModelEntry]" = weakref.WeakKeyDictionary()
        self.counters: Dict[str, int] = {}
        self.logged: set = set()
        self.patch = _PatchContext()
        self.vbar = _VbarContext()
        self.prompt_open = False
        self.mode = "old-loader"

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def log_once(self, level: int, message: str) -> None:
        if message not in self.logged:
            self.logged.add(message)
            _log.log(level, "%s", message)


_state: Optional[_Integration] = None
_enable_lock = threading.RLock()


def is_enabled() -> bool:
    """Whether the hooks are installed now."""
    return _state is not None


def _env_off() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() in ("0", "false", "off", "no")


def enable(*, cpu_targets: bool = False, fast_disk: bool = False, gather: bool = True, patches: bool = True,
           load_files: bool = True, ram_headroom: int = 4 << 30) -> Hooks:
    """Installs the hooks of Note [ComfyUI hook points] into the ComfyUI that is
    importable (``comfy.*``; ``execution`` when ComfyUI imports it) and returns
    them as :class:`Hooks`, true when pins serves casts. ``PINS_COMFY=0`` returns
    an empty, false one. Calling it again while enabled keeps the options of the
    first call, installs what has become available since, and returns the same
    report.

    - ``cpu_targets``: serve casts whose target is the CPU too (ComfyUI's
      ``--cpu``, or a manual cast that converts dtype on the CPU). Off by default:
      there a pin only adds a copy of each weight in RAM, so with ``--cpu`` pins
      does nothing (the INFO line says so). The tests use it.
    - ``fast_disk``: register models with no ``-loaded`` pins (disk reads are cheap).
    - ``gather``: weight and bias of a module in one pin and one transfer.
    - ``patches``: route LoRA factors of lowvram patches through pins.
    - ``load_files``: ComfyUI's ``load_torch_file`` reads safetensors files
      with ``pins.load_file`` (Note [ComfyUI hook points]).
    - ``ram_headroom``: bytes of available RAM ``free_memory`` keeps free after
      ComfyUI unloaded models from an accelerator into RAM.

    Raises ``ImportError`` when ComfyUI's ``comfy`` package cannot be imported.
    """
    global _state
    if _env_off():
        _log.info("torch_pins.comfy: %s=%s, not enabled", ENV_VAR, os.environ[ENV_VAR])
        return Hooks()
    with _enable_lock:
        if _state is not None:
            _install_all(_state)
            return _report(_state)
        try:
            import comfy.model_management  # noqa: F401  (ComfyUI itself; fails clearly outside it)
        except ImportError as e:
            raise ImportError(f"torch_pins.comfy.enable() needs ComfyUI importable (its 'comfy' package): {e}") from e
        if ram_headroom < 0:
            raise ValueError(f"ram_headroom must be >= 0, got {ram_headroom}")
        state = _Integration(dict(cpu_targets=cpu_targets, fast_disk=fast_disk, gather=gather,
                                  patches=patches, load_files=load_files, ram_headroom=int(ram_headroom)))
        memory = sys.modules.get("comfy.memory_management")
        state.mode = "dynamic-vram" if getattr(memory, "aimdo_enabled", False) else "old-loader"
        _state = state
        try:
            _install_all(state)
        except BaseException:
            _uninstall(state)
            _state = None
            raise
        report = _report(state)
        if not report.active:
            # Stay out cleanly: no registration, no cast, no budget hook.
            _uninstall(state)
            _state = None
            report = _report(state, reason=report.reason)
        _announce(state, report)
        return report


def disable() -> None:
    """Puts ComfyUI's functions back and forgets the models registered here."""
    global _state
    with _enable_lock:
        state = _state
        if state is None:
            return
        _state = None
        _uninstall(state)
    if state.prompt_open:
        pins.end_prompt()
    with state.lock:
        entries = list(state.entries.values())
        state.entries.clear()
    for entry in entries:
        if entry.finalizer is not None:
            entry.finalizer.detach()
        pins.forget_model(entry.pins_id)


@contextlib.contextmanager
def enabled(**options) -> Iterator[Hooks]:
    """``with pins.comfy.enabled():`` enables for the block (unless it was enabled
    already, or ``PINS_COMFY=0``) and disables again at its end."""
    was = is_enabled()
    hooks = enable(**options)
    try:
        yield hooks
    finally:
        if is_enabled() and not was:
            disable()


def stats() -> Dict[str, Any]:
    """The integration's own counters: ``casts`` (served through pins by
    ``cast_bias_weight``), ``vbar_casts`` (by ``cast_to_gathered``),
    ``fallback.<reason>``, ``patch_casts``, ``declined_pins``, ``invalidations``
    and ``invalidated_bytes``, ``ram_freed_bytes``, ``errors``, ``models``,
    ``loaded_files`` (read by ``pins.load_file`` for ``load_torch_file``) and
    ``load_fallback.<reason>`` (read by ComfyUI's loader); and
    ``mode``, ``hooks``, ``missing``, ``failed``, ``awaited``. The cache's
    counters are in ``pins.stats()``."""
    state = _state
    if state is None:
        return {"enabled": False}
    out: Dict[str, Any] = dict(state.counters)
    out["enabled"] = True
    out["mode"] = state.mode
    out["models"] = len(state.entries)
    out["hooks"] = sorted(state.hooks)
    out["missing"] = list(state.missing)
    out["failed"] = dict(state.failed)
    out["awaited"] = sorted(state.awaited)
    return out


def model_id(obj: Any) -> int:
    """The pins model id of a ModelPatcher or of its weight module; -1 if none."""
    state = _state
    if state is None:
        return -1
    module = getattr(obj, "model", obj)
    entry = state.owner.get(module) if isinstance(module, torch.nn.Module) else None
    return entry.pins_id if entry is not None else -1


# --- installing -------------------------------------------------------------

# The hook points: (module, class or "", attribute, wrapper maker, role). Roles:
# "register" and "cast" (legacy) / "vbar" (dynamic VRAM) make pins serve casts
# (Hooks.active); the rest refine what it does.
def _hook_points(options: Dict[str, Any]) -> List[Tuple[str, str, str, Callable[[Any], Any], str]]:
    points = [
        ("comfy.model_patcher", "ModelPatcher", "__init__", _wrap_patcher_init, "register"),
        ("comfy.ops", "", "cast_bias_weight", _wrap_cast_bias_weight, "cast"),
        ("comfy.pinned_memory", "", "get_pin", _wrap_get_pin, "vbar"),
        ("comfy.pinned_memory", "", "pin_memory", _wrap_pin_memory, "vbar"),
        ("comfy.model_management", "", "cast_to_gathered", _wrap_cast_to_gathered, "vbar"),
        ("comfy.model_management", "", "load_models_gpu", _wrap_load_models_gpu, "boundary"),
        ("comfy.model_management", "LoadedModel", "model_unload", _wrap_model_unload, "boundary"),
        ("comfy.model_management", "", "unload_all_models", _wrap_unload_all, "boundary"),
        ("comfy.model_patcher", "PromptModelTracker", "start", _wrap_tracker_start, "boundary"),
        ("comfy.model_patcher", "PromptModelTracker", "add", _wrap_tracker_add, "boundary"),
        ("comfy.model_patcher", "PromptModelTracker", "end", _wrap_tracker_end, "boundary"),
        ("comfy.model_management", "", "reset_cast_buffers", _wrap_reset_cast_buffers, "boundary"),
        ("execution", "PromptExecutor", "execute_async", _wrap_prompt, "boundary"),
        ("execution", "", "execute", _wrap_node, "boundary"),
        ("comfy.utils", "", "copy_to_param", _wrap_param_write, "write"),
        ("comfy.model_patcher", "ModelPatcher", "patch_weight_to_device", _wrap_patcher_write, "write"),
        ("comfy.model_patcher", "ModelPatcher", "patch_hook_weight_to_device", _wrap_patcher_write, "write"),
        ("comfy.model_patcher", "ModelPatcher", "pin_weight_to_device", _wrap_pin_weight, "budget"),
        ("comfy.model_management", "", "free_memory", _wrap_free_memory, "budget"),
        ("comfy.model_management", "", "free_pins", _wrap_comfy_free_pins, "budget"),
        ("comfy.model_management", "", "ensure_pin_registerable", _wrap_pin_registerable, "budget"),
    ]
    if options["patches"]:
        points.append(("comfy.model_management", "", "cast_to_device", _wrap_patch_cast, "cast"))
    if options["load_files"]:
        # comfy.utils' own, and the modules that took it by name at their import
        # (``from .utils import load_torch_file``).
        points += [(module, "", "load_torch_file", _wrap_load_torch_file, "load")
                   for module in ("comfy.utils", "comfy.clip_vision", "comfy.bg_removal_model")]
    return points


# Modules whose absence is a fact of the ComfyUI release, not worth a warning.
_OPTIONAL_MODULES = {"comfy.pinned_memory", "comfy.clip_vision", "comfy.bg_removal_model"}
# Modules never imported from here: ComfyUI imports them, and their hooks wait.
_AWAITED_MODULES = {"execution"}


def _import(state: _Integration, name: str) -> Any:
    """The module, or None: absent (this ComfyUI has no such module), failed
    (recorded with its exception), or awaited."""
    module = sys.modules.get(name)
    if module is not None or name in state.failed:
        return module
    if name in _AWAITED_MODULES:
        state.awaited.add(name)
        return None
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            return None  # absent
        state.failed[name] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001  (ComfyUI's module raised: record, never fatal)
        state.failed[name] = f"{type(e).__name__}: {e}"
    _log.warning("torch_pins.comfy: importing %s failed (%s); its hooks are left out", name, state.failed[name])
    return None


def _install_all(state: _Integration) -> None:
    """Installs every hook point whose module is here and that is not in yet."""
    state.missing = []
    executor = sys.modules.get("execution")
    for module_name, cls_name, attr, make, role in _hook_points(state.options):
        name = ".".join(p for p in (module_name, cls_name, attr) if p)
        if name in state.hooks:
            continue
        if module_name == "execution" and cls_name == "PromptExecutor" and executor is not None:
            # Older executors have only the synchronous form.
            cls = getattr(executor, "PromptExecutor", None)
            if cls is not None and not hasattr(cls, "execute_async"):
                attr, name = "execute", "execution.PromptExecutor.execute"
                if name in state.hooks:
                    continue
        module = _import(state, module_name)
        if module is None:
            if module_name not in state.failed and module_name not in state.awaited:
                if module_name not in _OPTIONAL_MODULES:
                    state.missing.append(name)
            continue
        owner = getattr(module, cls_name, None) if cls_name else module
        original = getattr(owner, attr, None) if owner is not None else None
        if original is None:
            state.missing.append(name)
            continue
        # A module that took a hooked function by name after it was hooked holds
        # our wrapper: wrap (and later restore) ComfyUI's own.
        original = getattr(original, "_pins_wraps", original)
        state.hooks[name] = _Hook(owner, attr, original, attr in vars(owner))
        setattr(owner, attr, make(original))
    state.awaited = {m for m in state.awaited if m not in sys.modules}
    if state.awaited:
        _ArrivalFinder.install()


def _uninstall(state: _Integration) -> None:
    for hook in reversed(list(state.hooks.values())):
        hook.restore()
    state.hooks.clear()
    _ArrivalFinder.remove()


def _active(state: _Integration) -> Tuple[bool, str]:
    have = set(state.hooks)
    if "comfy.model_patcher.ModelPatcher.__init__" not in have:
        return False, "models cannot be registered (comfy.model_patcher.ModelPatcher.__init__ is not hooked)"
    vbar = {"comfy.pinned_memory.get_pin", "comfy.pinned_memory.pin_memory",
            "comfy.model_management.cast_to_gathered"}
    if state.mode == "dynamic-vram" and not vbar <= have:
        return False, f"dynamic VRAM is on but its cast path is not hooked (missing {sorted(vbar - have)})"
    if state.mode == "old-loader" and "comfy.ops.cast_bias_weight" not in have:
        return False, "no cast is served (comfy.ops.cast_bias_weight is not hooked)"
    return True, ""


def _report(state: _Integration, reason: Optional[str] = None) -> Hooks:
    """What is in now; with ``reason``, the report of an enable() that stayed out."""
    report = Hooks(state.hooks)
    report.active, report.reason = _active(state) if reason is None else (False, reason)
    report.mode = state.mode
    report.missing = tuple(state.missing)
    report.failed = dict(state.failed)
    report.awaited = tuple(sorted(state.awaited))
    return report


def _comfy_version() -> str:
    version = sys.modules.get("comfyui_version")
    if version is None:
        try:
            import comfyui_version as version  # noqa: F811  (ComfyUI's own file at its root)
        except Exception:  # noqa: BLE001
            return "unknown"
    return str(getattr(version, "__version__", "unknown"))


def _announce(state: _Integration, report: Hooks) -> None:
    conf = pins.config()
    args = getattr(sys.modules.get("comfy.cli_args"), "args", None)
    cpu_only = bool(getattr(args, "cpu", False)) and not state.options["cpu_targets"]
    _log.info("torch_pins %s: %s in ComfyUI %s (%s mode), %d hooks in%s; policy %s, headroom %s, pin_reserve %s, "
              "backend %s%s", pins.__version__, "active" if report.active else "INACTIVE", _comfy_version(),
              state.mode, len(report), f", awaiting {', '.join(report.awaited)}" if report.awaited else "",
              conf.get("policy", "?"), _gib(conf.get("headroom")), _gib(conf.get("pin_reserve")),
              conf.get("backend", "?"),
              "; --cpu: every cast targets the CPU, so pins serves none (enable(cpu_targets=True) to serve them)"
              if cpu_only else "")
    if not report.active:
        _log.warning("torch_pins.comfy: pins is INACTIVE in this ComfyUI: %s%s. No hook is left in: ComfyUI runs "
                     "as without pins.", report.reason,
                     "".join(f"; {m} failed to import ({e})" for m, e in report.failed.items()))
    if report.missing:
        _log.info("torch_pins.comfy: this ComfyUI lacks %s; those hooks are left out", ", ".join(report.missing))


def _gib(value: Optional[str]) -> str:
    try:
        return f"{int(value) / (1 << 30):.1f} GiB"
    except (TypeError, ValueError):
        return str(value)


class _ArrivalLoader(importlib.abc.Loader):
    """Runs a module's own loader, then installs the hooks that waited for it."""

    def __init__(self, inner: Any):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _arrived(module.__name__)

    def __getattr__(self, name):  # get_source, get_code, ...: the module's own loader's
        return getattr(self._inner, name)


class _ArrivalFinder(importlib.abc.MetaPathFinder):
    """On sys.meta_path while a module's hooks are awaited (Note [ComfyUI hook points])."""

    _instance: Optional["_ArrivalFinder"] = None

    @classmethod
    def install(cls) -> None:
        if cls._instance is None:
            cls._instance = cls()
            sys.meta_path.insert(0, cls._instance)

    @classmethod
    def remove(cls) -> None:
        if cls._instance is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(cls._instance)
            cls._instance = None

    def find_spec(self, fullname, path, target=None):
        state = _state
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
            spec.loader = _ArrivalLoader(spec.loader)
        return spec


def _arrived(name: str) -> None:
    with _enable_lock:
        state = _state
        if state is None:
            return
        state.awaited.discard(name)
        _install_all(state)
        if not state.awaited:
            _ArrivalFinder.remove()
        _log.info("torch_pins.comfy: %s imported, its hooks are in (%d hooks)", name, len(state.hooks))


# --- models -------------------------------------------------------------------

def _forget(key: int, pins_id: int) -> None:
    state = _state
    if state is None:
        return
    with state.lock:
        state.entries.pop(key, None)
    try:
        pins.forget_model(pins_id)
    except Exception as e:  # during interpreter shutdown the library may be gone
        state.log_once(logging.DEBUG, f"torch_pins.comfy: forget_model({pins_id}) failed: {e}")


def _register(state: _Integration, patcher: Any) -> Optional[_ModelEntry]:
    module = getattr(patcher, "model", None)
    if not isinstance(module, torch.nn.Module):
        return None
    with state.lock:
        entry = state.entries.get(id(module))
        if entry is not None and entry.module() is module:
            return entry
        device = getattr(patcher, "load_device", None)
        if device is None:
            return None
        name = type(module).__name__  # pins.stats() keys a repeated name <name>#<id>
        try:
            pins_id = pins.register_model(name, device, fast_disk=state.options["fast_disk"],
                                          size=_model_size(patcher))
        except Exception as e:
            state.count("errors")
            state.log_once(logging.WARNING, f"torch_pins.comfy: cannot register {name} on {device}: {e}")
            return None
        entry = _ModelEntry(pins_id, name, module)
        entry.finalizer = weakref.finalize(module, _forget, id(module), pins_id)
        entry.finalizer.atexit = False
        state.entries[id(module)] = entry
        _map_modules(state, module, entry)
        return entry


def _model_size(patcher: Any) -> int:
    """The bytes of the patcher's weights (ModelPatcher.model_size(), cached by
    ComfyUI), which size pins' prewarm before the model's first prompt; 0 when
    this ComfyUI or stand-in has none."""
    try:
        size = patcher.model_size()
    except Exception:  # an older ModelPatcher, a stand-in, a module without a state_dict
        return 0
    return size if isinstance(size, int) and not isinstance(size, bool) and 0 <= size < (1 << 63) else 0


def _entry_of(state: _Integration, patcher: Any) -> Optional[_ModelEntry]:
    module = getattr(patcher, "model", None)
    return state.owner.get(module) if isinstance(module, torch.nn.Module) else None


def _map_modules(state: _Integration, module: torch.nn.Module, entry: _ModelEntry) -> None:
    for m in module.modules():
        state.owner[m] = entry


def _patchers(models: Any) -> List[Any]:
    out, seen = [], set()
    for m in list(models or ()):
        for p in [m] + list(getattr(m, "model_patches_models", lambda: [])()):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _wrap_patcher_init(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        state = _state
        if state is not None:
            _register(state, self)
    return __init__


def _wrap_load_models_gpu(original):
    @functools.wraps(original)
    def load_models_gpu(models, *args, **kwargs):
        state = _state
        if state is not None:
            ids = []
            for patcher in _patchers(models):
                entry = _register(state, patcher)
                if entry is not None:
                    module = entry.module()
                    if module is not None:  # layers added since registration
                        _map_modules(state, module, entry)
                    ids.append(entry.pins_id)
            if ids:
                pins.mark_prompt(ids)
                for i in ids:
                    pins.set_active(i, True)
        return original(models, *args, **kwargs)
    return load_models_gpu


def _wrap_model_unload(original):
    @functools.wraps(original)
    def model_unload(self, *args, **kwargs):
        unloaded = original(self, *args, **kwargs)
        state = _state
        if state is not None and unloaded:
            entry = _entry_of(state, getattr(self, "model", None))  # the LoadedModel's ModelPatcher
            if entry is not None:
                _set_inactive(entry.pins_id)
        return unloaded
    return model_unload


def _set_inactive(pins_id: int) -> None:
    with contextlib.suppress(ValueError):  # forgotten meanwhile
        pins.set_active(pins_id, False)


def _wrap_unload_all(original):
    @functools.wraps(original)
    def unload_all_models(*args, **kwargs):
        result = original(*args, **kwargs)
        state = _state
        if state is not None:
            with state.lock:
                ids = [e.pins_id for e in state.entries.values()]
            for i in ids:
                _set_inactive(i)
            freed = int(pins.free_pins(_MAX_BYTES, True))
            state.count("ram_freed_bytes", freed)
            state.count("unload_all")
        return result
    return unload_all_models


# --- prompt and node boundaries ---------------------------------------------------

def _prompt_started(state: _Integration) -> None:
    pins.mark_prompt([])
    state.prompt_open = True


def _prompt_ended(state: _Integration) -> None:
    state.prompt_open = False
    pins.end_prompt()
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("torch_pins.comfy: prompt done\n%s", pins.summary())


def _tracker_drives(state: Optional[_Integration]) -> bool:
    """ComfyUI's PromptModelTracker marks the prompt: the executor's hooks stand aside."""
    return state is not None and "comfy.model_patcher.PromptModelTracker.start" in state.hooks \
        and "comfy.model_patcher.PromptModelTracker.end" in state.hooks


def _reset_drives(state: Optional[_Integration]) -> bool:
    """Under dynamic VRAM ComfyUI's reset_cast_buffers ends each node: execution.execute's hook stands aside."""
    if state is None or "comfy.model_management.reset_cast_buffers" not in state.hooks:
        return False
    return bool(getattr(sys.modules.get("comfy.memory_management"), "aimdo_enabled", False))


def _wrap_tracker_start(original):
    @functools.wraps(original)
    def start(self, *args, **kwargs):
        result = original(self, *args, **kwargs)  # ends the tracker's previous prompt first
        state = _state
        if state is not None:
            if state.prompt_open:
                _prompt_ended(state)
            _prompt_started(state)
        return result
    return start


def _wrap_tracker_add(original):
    @functools.wraps(original)
    def add(self, outputs, *args, **kwargs):
        result = original(self, outputs, *args, **kwargs)
        state = _state
        if state is not None:
            ids = []
            for patcher in list(getattr(self, "models", {}).values()):
                entry = _register(state, patcher)
                if entry is not None:
                    ids.append(entry.pins_id)
            if ids:
                pins.mark_prompt(ids)
        return result
    return add


def _wrap_tracker_end(original):
    @functools.wraps(original)
    def end(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state = _state
        if state is not None and state.prompt_open:
            _prompt_ended(state)
        return result
    return end


def _wrap_reset_cast_buffers(original):
    @functools.wraps(original)
    def reset_cast_buffers(*args, **kwargs):
        result = original(*args, **kwargs)
        if _reset_drives(_state):
            pins.end_node()
        return result
    return reset_cast_buffers


def _wrap_prompt(original):
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def run_prompt(self, *args, **kwargs):
            state = _state
            if state is None or _tracker_drives(state):
                return await original(self, *args, **kwargs)
            _prompt_started(state)
            try:
                return await original(self, *args, **kwargs)
            finally:
                _prompt_ended(state)
        return run_prompt

    @functools.wraps(original)
    def run_prompt_sync(self, *args, **kwargs):
        state = _state
        if state is None or _tracker_drives(state):
            return original(self, *args, **kwargs)
        _prompt_started(state)
        try:
            return original(self, *args, **kwargs)
        finally:
            _prompt_ended(state)
    return run_prompt_sync


def _node_ended() -> None:
    state = _state
    if state is not None and not _reset_drives(state):
        pins.end_node()


def _wrap_node(original):
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def execute(*args, **kwargs):
            try:
                return await original(*args, **kwargs)
            finally:
                _node_ended()
        return execute

    @functools.wraps(original)
    def execute_sync(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            _node_ended()
    return execute_sync


# --- the cast path ------------------------------------------------------------------

def _is_cpu(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def _wants_copy(state: _Integration, source: torch.Tensor, device: torch.device, dtype: Optional[torch.dtype],
                copy: bool) -> Optional[str]:
    """None when pins should serve a cast of ``source`` to ``device``, else why not."""
    if not _is_cpu(source):
        return "not-cpu"
    if device.type == "cpu":
        if not state.options["cpu_targets"]:
            return "cpu-target"
        if not copy and (dtype is None or dtype == source.dtype):
            return "no-copy"  # ComfyUI hands the tensor itself over
    return None


def _non_blocking(device: torch.device) -> bool:
    mm = sys.modules.get("comfy.model_management")
    probe = getattr(mm, "device_supports_non_blocking", None)
    try:
        return bool(probe(device)) if probe is not None else device.type == "cuda"
    except Exception:
        return False


def _cast_one(source, device, dtype, non_blocking, model):
    # A wrapper (QuantizedTensor) keeps its dtype here: _finish_wrapper then
    # applies ComfyUI's rule for it.
    return pins.cast_to_device(source, device, None if _subclass.is_wrapper(source) else dtype, non_blocking, model)


def _quantized_type() -> Optional[type]:
    quant = sys.modules.get("comfy.quant_ops")
    cls = getattr(quant, "QuantizedTensor", None)
    return cls if isinstance(cls, type) and issubclass(cls, torch.Tensor) else None


def _finish_wrapper(t: torch.Tensor, dtype: Optional[torch.dtype], has_function: bool) -> torch.Tensor:
    # As ComfyUI does with a quantized weight it cast: keep it quantized unless
    # the compute dtype or a patch function needs plain values.
    if dtype is not None and (has_function or t.dtype != dtype):
        t = t.to(dtype)
        quantized = _quantized_type()
        if quantized is not None and isinstance(t, quantized):
            t = t.dequantize()
    return t


def _patch_signature(entry: _ModelEntry, functions: List[Any]) -> int:
    module = entry.module()
    uuid = getattr(module, "current_weight_patches_uuid", None)
    if uuid is not None and hasattr(uuid, "int"):
        return uuid.int & _MASK63
    parts = []
    for f in functions:
        patches = getattr(f, "patches", None)
        key = getattr(f, "key", None)
        listed = patches.get(key, ()) if isinstance(patches, dict) else ()
        parts.append((key, tuple((p[0], id(p[1]), p[2]) for p in listed if isinstance(p, tuple) and len(p) >= 3)))
    return hash(tuple(parts)) & _MASK63


@contextlib.contextmanager
def _patch_scope(state: _Integration, entry: _ModelEntry, functions: List[Any]) -> Iterator[None]:
    ctx = state.patch
    saved = (ctx.active, ctx.model, ctx.signature)
    ctx.active, ctx.model, ctx.signature = True, entry.pins_id, _patch_signature(entry, functions)
    try:
        yield
    finally:
        ctx.active, ctx.model, ctx.signature = saved


class _Cast:
    """Weight and bias of a module, brought over by pins; its patch functions
    still to run."""

    def __init__(self, entry, weight, bias, weight_functions, bias_functions):
        self.entry, self.weight, self.bias = entry, weight, bias
        self.weight_functions, self.bias_functions = weight_functions, bias_functions


def _cast_module(state, s, input, dtype, device, bias_dtype):
    """Casts weight and bias of module ``s`` through pins; a string says why not."""
    if hasattr(s, "_v"):
        return "dynamic-vram"
    if getattr(s, "weight_lowvram_function", None) is not None or \
            getattr(s, "bias_lowvram_function", None) is not None:
        return "lowvram-function"
    quantized = _quantized_type()
    if input is not None:
        if quantized is not None and isinstance(input, quantized):
            return "quantized-input"
        if dtype is None:
            dtype = input.dtype
        if bias_dtype is None:
            bias_dtype = dtype
        if device is None:
            device = input.device
    if device is None:
        return "no-device"
    device = torch.device(device)
    weight = getattr(s, "weight", None)
    bias = getattr(s, "bias", None)
    if not isinstance(weight, torch.Tensor):
        return "no-weight"
    weight_functions = list(getattr(s, "weight_function", ()) or ())
    bias_functions = list(getattr(s, "bias_function", ()) or ())
    why = _wants_copy(state, weight, device, dtype, bool(weight_functions))
    if why is None and bias is not None:
        why = _wants_copy(state, bias, device, bias_dtype, bool(bias_functions))
    if why is not None:
        return why
    entry = state.owner.get(s)
    if entry is None:
        return "unregistered"

    non_blocking = _non_blocking(device)
    model = entry.pins_id
    plain = not _subclass.is_wrapper(weight) and not (bias is not None and _subclass.is_wrapper(bias))
    if bias is not None and plain and state.options["gather"] and bias_dtype == dtype:
        w, b = pins.cast_many_to_device([weight, bias], device, dtype, non_blocking, model)
        state.count("gathered")
    else:
        w = _cast_one(weight, device, dtype, non_blocking, model)
        b = _cast_one(bias, device, bias_dtype, non_blocking, model) if bias is not None else None
    if _subclass.is_wrapper(w):
        w = _finish_wrapper(w, dtype, bool(weight_functions))
    if b is not None and _subclass.is_wrapper(b):
        b = _finish_wrapper(b, bias_dtype, bool(bias_functions))
    return _Cast(entry, w, b, weight_functions, bias_functions)


def _stream_context(stream: Any) -> Any:
    """Entering ``stream`` as ComfyUI does (``as_context`` where it has one)."""
    if stream is None:
        return contextlib.nullcontext()
    return stream.as_context(stream) if hasattr(stream, "as_context") else stream


def _offload_stream(device: Any) -> Any:
    """ComfyUI's offload stream for ``device`` (None where it has none: the CPU,
    streams off, an older ComfyUI)."""
    mm = sys.modules.get("comfy.model_management")
    get = getattr(mm, "get_offload_stream", None)
    if get is None or device is None:
        return None
    return get(torch.device(device))


def _wrap_cast_bias_weight(original):
    params = inspect.signature(original).parameters
    offloadable_at = list(params).index("offloadable") if "offloadable" in params else None

    @functools.wraps(original)
    def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None, *args, **kwargs):
        state = _state
        if state is None:
            return original(s, input, dtype, device, bias_dtype, *args, **kwargs)
        offloadable = kwargs.get("offloadable", False)
        if offloadable_at is not None and len(args) > offloadable_at - 5:
            offloadable = args[offloadable_at - 5]
        stream = None
        try:
            if offloadable and not hasattr(s, "_v"):
                # ComfyUI's contract (uncast_bias_weight): copies on its offload
                # stream, the compute stream waits for them, the stream waits for
                # the compute before its buffers are reused.
                stream = _offload_stream(device if device is not None else getattr(input, "device", None))
            with _stream_context(stream):
                cast = _cast_module(state, s, input, dtype, device, bias_dtype)
        except Exception as e:
            state.count("errors")
            state.log_once(logging.WARNING, f"torch_pins.comfy: cast through pins failed, ComfyUI casts instead: "
                                            f"{type(e).__name__}: {e}")
            cast = "error"
        if isinstance(cast, str):
            state.count(f"fallback.{cast}")
            return original(s, input, dtype, device, bias_dtype, *args, **kwargs)
        state.count("casts")
        if stream is not None:
            state.count("offload_stream_casts")
            sync = getattr(sys.modules.get("comfy.model_management"), "sync_stream", None)
            if sync is not None:
                sync(cast.weight.device, stream)
        # The patch functions are ComfyUI's: what they raise is theirs.
        w, b = cast.weight, cast.bias
        if b is not None and cast.bias_functions:
            with _patch_scope(state, cast.entry, cast.bias_functions):
                for f in cast.bias_functions:
                    b = f(b)
        if cast.weight_functions:
            with _patch_scope(state, cast.entry, cast.weight_functions):
                for f in cast.weight_functions:
                    w = f(w)
        if not offloadable:
            return w, b
        # uncast_bias_weight's triple: the stream, and the buffers copied on it
        # (before the patch functions), which it keeps until the compute used them.
        return w, b, ((stream, cast.weight, cast.bias) if stream is not None else None)
    return cast_bias_weight


def _wrap_patch_cast(original):
    @functools.wraps(original)
    def cast_to_device(tensor, device, dtype, copy=False):
        state = _state
        if state is None or not state.patch.active or not isinstance(tensor, torch.Tensor) \
                or _subclass.is_wrapper(tensor):
            return original(tensor, device, dtype, copy)
        device = torch.device(device)
        if _wants_copy(state, tensor, device, dtype, copy) is not None:
            return original(tensor, device, dtype, copy)
        ctx = state.patch
        try:
            # resident: patches-loaded, kept across nodes and prompts while the
            # patch set (the signature) is unchanged (Note [ComfyUI hook points]).
            out = pins.cast_to_device(tensor, device, dtype, _non_blocking(device), ctx.model, "patches",
                                      True, ctx.signature)
        except Exception as e:
            state.count("errors")
            state.log_once(logging.WARNING, f"torch_pins.comfy: patch cast through pins failed: "
                                            f"{type(e).__name__}: {e}")
            return original(tensor, device, dtype, copy)
        state.count("patch_casts")
        return out
    return cast_to_device


# --- writes that bypass the version counter ---------------------------------------

def _invalidate(state: _Integration, tensor: Any) -> None:
    if not _is_cpu(tensor):
        return
    try:
        leaves = _subclass.inner_tensors(tensor)
    except ValueError:
        return
    for t in leaves:
        if _is_cpu(t):
            state.count("invalidations")
            state.count("invalidated_bytes", int(pins.invalidate(t)))


def _attr(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _wrap_param_write(original):
    @functools.wraps(original)
    def write(obj, attr, value, *args, **kwargs):
        result = original(obj, attr, value, *args, **kwargs)
        state = _state
        if state is not None:
            _invalidate(state, _attr(obj, attr))
        return result
    return write


def _wrap_patcher_write(original):
    signature = inspect.signature(original)
    patches_param = "combined_patches" if "combined_patches" in signature.parameters else None

    @functools.wraps(original)
    def write(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state = _state
        if state is None:
            return result
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return result
        key = bound.arguments.get("key")
        patches = bound.arguments.get(patches_param) if patches_param else getattr(self, "patches", {})
        if isinstance(key, str) and isinstance(patches, dict) and key in patches:
            _invalidate(state, _attr(getattr(self, "model", None), key))
        return result
    return write


# --- RAM pressure ------------------------------------------------------------------

def _available_ram() -> Optional[int]:
    mm = sys.modules.get("comfy.model_management")
    probe = getattr(mm, "get_free_memory", None)
    try:
        return int(probe(torch.device("cpu"))) if probe is not None else None
    except Exception:
        return None


def _relieve(state: _Integration, need: float) -> int:
    """Frees pins until ``need`` bytes of RAM are available (as ComfyUI measures it)."""
    available = _available_ram()
    if available is None:
        return 0
    shortfall = min(int(need) - available, _MAX_BYTES)
    if shortfall <= 0:
        return 0
    freed = int(pins.free_pins(shortfall))
    state.count("ram_freed_bytes", freed)
    return freed


def _wrap_free_memory(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def free_memory(memory_required, device, *args, **kwargs):
        state = _state
        if state is None:
            return original(memory_required, device, *args, **kwargs)
        try:
            bound = signature.bind(memory_required, device, *args, **kwargs).arguments
        except TypeError:
            bound = {}
        # pins_required asks for room to page-lock, not RAM: ComfyUI's
        # ensure_pin_budget weighs it, through free_pins (Note [ComfyUI as pins' host]).
        ram = float(bound.get("ram_required", 0) or 0)
        on_cpu = device is None or torch.device(device).type == "cpu"
        if on_cpu:
            ram += float(memory_required or 0)
        if ram > 0:  # pins go before ComfyUI unloads models for RAM
            _relieve(state, ram)
        unloaded = original(memory_required, device, *args, **kwargs)
        if not on_cpu and unloaded:  # the unloaded weights came back to RAM
            _relieve(state, state.options["ram_headroom"])
        return unloaded
    return free_memory


def _wrap_comfy_free_pins(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def free_pins(size, *args, **kwargs):
        state = _state
        if state is None or size <= 0:
            return original(size, *args, **kwargs)
        try:
            bound = signature.bind(size, *args, **kwargs).arguments
        except TypeError:
            bound = {}
        evict_active, loaded = bool(bound.get("evict_active", False)), bool(bound.get("loaded", False))
        # The same tiers as ComfyUI's walk (Note [ComfyUI as pins' host]): pins'
        # pins first, ComfyUI's own (models pins does not serve) for the rest.
        ours = int(pins.free_pins(min(int(size), _MAX_BYTES), evict_active, loaded))
        state.count("ram_freed_bytes", ours)
        if ours >= size:
            return ours
        return ours + original(size - ours, *args, **kwargs)
    return free_pins


def _wrap_pin_registerable(original):
    @functools.wraps(original)
    def ensure_pin_registerable(size, *args, **kwargs):
        state = _state
        mm = sys.modules.get("comfy.model_management")
        if state is not None and mm is not None:
            cap = float(getattr(mm, "MAX_PINNED_MEMORY", -1))
            if cap > 0:  # ComfyUI's page-lock cap counts pins' page-locked bytes too
                over = float(getattr(mm, "TOTAL_PINNED_MEMORY", 0)) + pins.locked_bytes() + size - cap
                if over > 0:
                    freed = int(pins.free_pins(min(int(over), _MAX_BYTES), bool(kwargs.get("evict_active", True))))
                    state.count("ram_freed_bytes", freed)
        return original(size, *args, **kwargs)
    return ensure_pin_registerable


def _wrap_pin_weight(original):
    @functools.wraps(original)
    def pin_weight_to_device(self, key, *args, **kwargs):
        state = _state
        if state is not None:
            entry = _entry_of(state, self)
            device = getattr(self, "load_device", None)
            if entry is not None and (state.options["cpu_targets"] or torch.device(device).type != "cpu"):
                # pins' pin of this weight is its one pinned copy, in pins' budget.
                state.count("declined_pins")
                return None
        return original(self, key, *args, **kwargs)
    return pin_weight_to_device


# --- the dynamic-VRAM cast path (Note [ComfyUI as pins' host]) ----------------------

def _serves_layer(state: _Integration, module: Any) -> bool:
    return isinstance(module, torch.nn.Module) and state.owner.get(module) is not None


def _wrap_get_pin(original):
    @functools.wraps(original)
    def get_pin(module, subset="weights", *args, **kwargs):
        state = _state
        if state is not None and _serves_layer(state, module):
            state.vbar.module, state.vbar.subset = module, subset
            return None  # pins holds the layer's pin: cast_to_gathered copies through it
        return original(module, subset, *args, **kwargs)
    return get_pin


def _wrap_pin_memory(original):
    @functools.wraps(original)
    def pin_memory(module, subset="weights", *args, **kwargs):
        state = _state
        if state is not None and _serves_layer(state, module):
            state.vbar.module, state.vbar.subset = module, subset
            state.count("declined_pins")
            return None
        return original(module, subset, *args, **kwargs)
    return pin_memory


def _vbar_cast(state: _Integration, tensors: Any, r: Any, r2: Any, non_blocking: bool, stream: Any) -> Optional[str]:
    """Copies a registered layer's weight and bias into ComfyUI's destination
    through pins; None when done, else why not."""
    ctx = state.vbar
    module, subset = ctx.module, ctx.subset
    ctx.module = None
    if module is None:
        return "vbar-no-layer"
    entry = state.owner.get(module)
    if entry is None:
        return "unregistered"
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 2 \
            or tensors[0] is not getattr(module, "weight", None) or tensors[1] is not getattr(module, "bias", None):
        return "vbar-sources"
    dest = r2 if r is None else (r if r2 is None else None)
    if not isinstance(dest, torch.Tensor):
        return "vbar-destination"
    if dest.device.type == "cpu" and not state.options["cpu_targets"]:
        return "cpu-target"
    if any(t is not None and not _is_cpu(t) for t in tensors):
        return "not-cpu"
    memory = sys.modules.get("comfy.memory_management")
    views = memory.interpret_gathered_like(list(tensors), dest)
    resident = subset.endswith("-loaded")
    with _stream_context(stream):
        for t, view in zip(tensors, views):
            if t is not None:
                pins.cast_to_device(t, view.device, None, non_blocking, entry.pins_id, "weights", resident, None,
                                    out=view)
    mm = sys.modules.get("comfy.model_management")
    mark = getattr(mm, "mark_mmap_dirty", None)
    if mark is not None:  # as ComfyUI's own copy: an mmap read from is bounced at the node's end
        for t in tensors:
            if t is not None:
                mark(_subclass.inner_tensors(t)[0].untyped_storage() if _subclass.is_wrapper(t)
                     else t.untyped_storage())
    return None


def _wrap_cast_to_gathered(original):
    @functools.wraps(original)
    def cast_to_gathered(tensors, r, non_blocking=False, stream=None, r2=None):
        state = _state
        if state is None:
            return original(tensors, r, non_blocking=non_blocking, stream=stream, r2=r2)
        try:
            why = _vbar_cast(state, tensors, r, r2, non_blocking, stream)
        except Exception as e:
            state.count("errors")
            state.log_once(logging.WARNING, f"torch_pins.comfy: vbar cast through pins failed, ComfyUI casts "
                                            f"instead: {type(e).__name__}: {e}")
            why = "error"
        if why is None:
            state.count("vbar_casts")
            return None
        if why != "vbar-no-layer":  # not a layer's weights (a patch, ComfyUI's own pin): not counted
            state.count(f"fallback.{why}")
        return original(tensors, r, non_blocking=non_blocking, stream=stream, r2=r2)
    return cast_to_gathered


# --- safetensors loading (Note [ComfyUI hook points]) ----------------------------

def _safetensors_header(path: str) -> Dict[str, Any]:
    """The JSON header of a safetensors file: an 8-byte little-endian length, then
    that many bytes of JSON (pins.load_file has checked the file already)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def _load_file(state: _Integration, path: Any, device: Any, return_metadata: bool) -> Any:
    """What ComfyUI's load_torch_file(path, device=device, return_metadata=...)
    returns, over pins' mapping of the file; a string says why ComfyUI's own
    loader reads it instead. comfy.utils' switches are read at each call, as
    ComfyUI reads them."""
    if not isinstance(path, str) or not path.lower().endswith((".safetensors", ".sft")):
        return "not-safetensors"  # torch.load: safe_load and --mmap-torch-files are ComfyUI's
    if device is not None and not (isinstance(device, torch.device) and device.type == "cpu"):
        return "device"
    utils = sys.modules.get("comfy.utils")
    # ComfyUI under dynamic VRAM reads safetensors with its load_safetensors
    # (comfy-aimdo's mapping), the old loader with safetensors' safe_open.
    aimdo = hasattr(utils, "load_safetensors") and \
        bool(getattr(sys.modules.get("comfy.memory_management"), "aimdo_enabled", False))
    if not aimdo and getattr(utils, "DISABLE_MMAP", False):
        return "disable-mmap"  # --disable-mmap: safe_open's tensors copied out of the mapping
    try:
        sd = pins.load_file(path)
        header = _safetensors_header(path) if aimdo or return_metadata else {}
    except Exception as e:  # noqa: BLE001  (refused, unreadable: ComfyUI's loader, and its error, decide)
        state.log_once(logging.INFO, f"torch_pins.comfy: pins cannot load {path} ({type(e).__name__}: {e}); "
                                     f"ComfyUI's loader reads it")
        return "refused"
    known = getattr(utils, "_TYPES", None) if aimdo else None
    if isinstance(known, dict) and any(isinstance(v, dict) and v.get("dtype") not in known
                                       for k, v in header.items() if k != "__metadata__"):
        return "dtype"  # a dtype load_safetensors has no torch type for: its error
    # The order ComfyUI's dict has: the header's under dynamic VRAM, safe_open's
    # keys() (sorted) otherwise.
    order = [k for k in header if k != "__metadata__"] if aimdo else sorted(sd)
    if len(order) != len(sd) or any(k not in sd for k in order):
        return "changed"  # the file was replaced between the two reads
    out = {k: sd[k] for k in order}
    if not return_metadata:
        return out
    # safe_open's metadata() is None without a __metadata__ entry, load_safetensors' {}.
    return out, header.get("__metadata__", {} if aimdo else None)


def _wrap_load_torch_file(original):
    signature = inspect.signature(original)
    path_param = next(iter(signature.parameters))

    @functools.wraps(original)
    def load_torch_file(*args, **kwargs):
        state = _state
        if state is None:
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            loaded = "arguments"  # ComfyUI's own raises what it raises
        else:
            loaded = _load_file(state, bound.get(path_param), bound.get("device"),
                                bool(bound.get("return_metadata", False)))
        if isinstance(loaded, str):
            state.count(f"load_fallback.{loaded}")
            return original(*args, **kwargs)
        state.count("loaded_files")
        return loaded
    load_torch_file._pins_wraps = original
    return load_torch_file
