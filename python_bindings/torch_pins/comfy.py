"""Plug pins into ComfyUI: ``torch_pins.comfy.enable()``.

Call it once after ComfyUI is imported (a file in ``custom_nodes/`` does it at
start-up; README "ComfyUI" shows one). It replaces a few functions of the
running ComfyUI with wrappers that call the original and pins around it, and
:func:`disable` puts the originals back, so that ComfyUI then runs exactly as
without pins. ``PINS_COMFY=0`` in the environment makes :func:`enable` a no-op.

Note [ComfyUI hook points]
~~~~~~~~~~~~~~~~~~~~~~~~~~
Each hook is looked up by name and installed only where the running ComfyUI
has it; a missing one is logged once and left out (:func:`stats` lists it under
``missing``). What each hook does, and why there:

- ``comfy.model_patcher.ModelPatcher.__init__`` (clones run it too): register a
  pins model for the patcher's ``model`` (the ``torch.nn.Module`` that holds the
  weights; clones share it, so they share the pins model), named after the
  module's class (``SDXL``, ``AutoencoderKL``), with the patcher's ``load_device``. It is forgotten when that
  module is garbage collected (``weakref.finalize``), not when one clone dies:
  the other clones and the parent still use the weights.
- ``comfy.ops.cast_bias_weight``, the one function that ComfyUI's
  ``manual_cast``/lowvram layers (and ``fp8_ops``, ControlNet's LoRA layers) call
  to bring a module's weight and bias to the compute device: weight and bias of
  a registered module go through pins, in one gathered pin and one transfer
  when they share a dtype (``cast_many_to_device``), else one cast each; wrapper
  subclasses (``QuantizedTensor``) through ``_subclass`` (Note [Wrapper
  subclasses]). The module's ``weight_function``/``bias_function`` (lowvram LoRA
  patches, ``LowVramPatch``) then run on the result as in ComfyUI. The original
  serves everything else, counted by reason under ``fallback.<reason>``: weights
  already on the device, unregistered modules, ComfyUI's dynamic-VRAM modules
  (``_v``: ComfyUI pins those itself), the newer ``*_lowvram_function`` patch
  path, a CPU target unless ``cpu_targets``.
- ``comfy.model_management.cast_to_device``, which LoRA patches
  (``comfy.lora.calculate_weight`` and the weight adapters) call to bring their
  factors to the weight's device: inside a patch function run by the hook above,
  factors go through pins with ``kind="patches"`` and the patch set's signature:
  the patched model's ``current_weight_patches_uuid`` (ComfyUI renews it whenever
  the patch set changes), else a hash of the patch list. Elsewhere the original.
- ``comfy.model_management.load_models_gpu``, the call every node makes before
  it runs a model (sampler, text encoder, VAE): mark the models (and their patch
  models) as used by the prompt and active, before ComfyUI loads them.
- ``execution.PromptExecutor.execute_async`` (``execute`` where there is no
  async form): a prompt starts (``mark_prompt([])``) and ends (``end_prompt``).
- ``execution.execute``, which runs one node: ``end_node`` after it (patch pins
  dropped, active cleared, the prompt kept).
- Writes of weights that bypass the version counter (``.data``; and inference
  tensors have none): ``comfy.utils.copy_to_param`` (in-place LoRA, backup
  restore in ``unpatch_model`` and ``partially_unload``, hook patches) and
  ``ModelPatcher.patch_weight_to_device`` / ``patch_hook_weight_to_device``
  (whose ``set_func`` may write ``weight.data`` directly): ``pins.invalidate``
  on the written tensor afterwards, so no pin serves the old bytes.
  ``comfy.utils.set_attr_param`` is left alone: it replaces a parameter and
  writes no bytes; the tensor it drops keeps valid pins (ComfyUI keeps it as
  the backup it restores next, and a pin of a tensor that dies goes with it).
- RAM pressure: ``comfy.model_management.free_memory`` (for the CPU, or a
  ``ram_required``/``pins_required`` request, the shortfall is freed from pins
  first; for an accelerator, after models were unloaded into RAM, pins give
  back what is below ``ram_headroom``), and, where they exist,
  ``comfy.model_management.free_pins`` (ComfyUI's own pin eviction: pins are
  freed first and counted) and ``comfy.memory_management.extra_ram_release``.

Errors from pins in a cast are not ComfyUI's: the cast falls back to the
original, the error is counted (``errors``) and logged once per message.
"""
import contextlib
import functools
import inspect
import logging
import os
import sys
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

import torch_pins as pins

from . import _subclass

__all__ = ["enable", "disable", "enabled", "is_enabled", "stats", "model_id", "ENV_VAR"]

ENV_VAR = "PINS_COMFY"
_log = logging.getLogger("torch_pins.comfy")
_MASK63 = (1 << 63) - 1
_MAX_BYTES = 1 << 62  # ComfyUI asks for 1e30 bytes to mean "everything"


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


class _Integration:
    def __init__(self, options: Dict[str, Any]):
        self.options = options
        self.hooks: List[_Hook] = []
        self.missing: List[str] = []
        self.lock = threading.RLock()
        self.entries: Dict[int, _ModelEntry] = {}  # id(weight module) -> entry
        self.owner: "weakref.WeakKeyDictionary[torch.nn.Module, _ModelEntry]" = weakref.WeakKeyDictionary()
        self.counters: Dict[str, int] = {}
        self.logged: set = set()
        self.patch = _PatchContext()
        self.prompt_open = False

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def log_once(self, level: int, message: str) -> None:
        if message not in self.logged:
            self.logged.add(message)
            _log.log(level, "%s", message)


_state: Optional[_Integration] = None


def is_enabled() -> bool:
    """Whether the hooks are installed now."""
    return _state is not None


def _env_off() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() in ("0", "false", "off", "no")


def enable(*, cpu_targets: bool = False, fast_disk: bool = False, gather: bool = True, patches: bool = True,
           ram_headroom: int = 4 << 30) -> bool:
    """Installs the hooks of Note [ComfyUI hook points] into the ComfyUI that is
    imported (``comfy.*``, ``execution``); returns whether they were installed
    (``False`` when ``PINS_COMFY=0``; calling it again while enabled changes
    nothing and returns ``True``).

    - ``cpu_targets``: serve casts whose target is the CPU too (ComfyUI's
      ``--cpu``, or a manual cast that converts dtype on the CPU). Off by default:
      there a pin only adds a copy of each weight in RAM. The tests use it.
    - ``fast_disk``: register models with no ``-loaded`` pins (disk reads are cheap).
    - ``gather``: weight and bias of a module in one pin and one transfer.
    - ``patches``: route LoRA factors of lowvram patches through pins.
    - ``ram_headroom``: bytes of available RAM the RAM-pressure hooks keep free.

    Raises ``ImportError`` when ComfyUI's ``comfy`` package cannot be imported.
    """
    global _state
    if _env_off():
        _log.info("torch_pins.comfy: %s=%s, not enabled", ENV_VAR, os.environ[ENV_VAR])
        return False
    if _state is not None:
        return True
    try:
        import comfy.model_management  # noqa: F401  (ComfyUI itself; fails clearly outside it)
    except ImportError as e:
        raise ImportError(f"torch_pins.comfy.enable() needs ComfyUI importable (its 'comfy' package): {e}") from e
    if ram_headroom < 0:
        raise ValueError(f"ram_headroom must be >= 0, got {ram_headroom}")
    state = _Integration(dict(cpu_targets=cpu_targets, fast_disk=fast_disk, gather=gather,
                              patches=patches, ram_headroom=int(ram_headroom)))
    _state = state
    try:
        _install_all(state)
    except BaseException:
        _uninstall(state)
        _state = None
        raise
    if state.missing:
        _log.warning("torch_pins.comfy: this ComfyUI lacks %s; those hooks are left out", ", ".join(state.missing))
    return True


def disable() -> None:
    """Puts ComfyUI's functions back and forgets the models registered here."""
    global _state
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
def enabled(**options) -> Iterator[bool]:
    """``with pins.comfy.enabled():`` enables for the block (unless it was enabled
    already, or ``PINS_COMFY=0``) and disables again at its end."""
    was = is_enabled()
    on = enable(**options)
    try:
        yield on
    finally:
        if on and not was:
            disable()


def stats() -> Dict[str, Any]:
    """The integration's own counters: ``casts`` (served through pins),
    ``fallback.<reason>``, ``patch_casts``, ``invalidations`` and
    ``invalidated_bytes``, ``ram_freed_bytes``, ``errors``, ``models``; and
    ``missing``, the hook points this ComfyUI lacks. The cache's counters are in
    ``pins.stats()``."""
    state = _state
    if state is None:
        return {"enabled": False}
    out: Dict[str, Any] = dict(state.counters)
    out["enabled"] = True
    out["models"] = len(state.entries)
    out["missing"] = list(state.missing)
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

def _install(state: _Integration, owner: Any, owner_name: str, name: str, make: Callable[[Any], Any]) -> bool:
    original = getattr(owner, name, None) if owner is not None else None
    if original is None:
        state.missing.append(f"{owner_name}.{name}")
        return False
    replacement = make(original)
    state.hooks.append(_Hook(owner, name, original, name in vars(owner)))
    setattr(owner, name, replacement)
    return True


def _uninstall(state: _Integration) -> None:
    for hook in reversed(state.hooks):
        hook.restore()
    state.hooks.clear()


def _module(name: str) -> Any:
    try:
        __import__(name)
    except ImportError:
        return None
    return sys.modules.get(name)


def _install_all(state: _Integration) -> None:
    mm = _module("comfy.model_management")
    ops = _module("comfy.ops")
    utils = _module("comfy.utils")
    mp = _module("comfy.model_patcher")
    memory = _module("comfy.memory_management")
    execution = sys.modules.get("execution")  # ComfyUI's executor; never imported from here
    patcher_cls = getattr(mp, "ModelPatcher", None)
    executor_cls = getattr(execution, "PromptExecutor", None)

    _install(state, patcher_cls, "comfy.model_patcher.ModelPatcher", "__init__", _wrap_patcher_init)
    _install(state, ops, "comfy.ops", "cast_bias_weight", _wrap_cast_bias_weight)
    if state.options["patches"]:
        _install(state, mm, "comfy.model_management", "cast_to_device", _wrap_patch_cast)
    _install(state, mm, "comfy.model_management", "load_models_gpu", _wrap_load_models_gpu)
    if executor_cls is not None and hasattr(executor_cls, "execute_async"):
        _install(state, executor_cls, "execution.PromptExecutor", "execute_async", _wrap_prompt)
    else:
        _install(state, executor_cls, "execution.PromptExecutor", "execute", _wrap_prompt)
    _install(state, execution, "execution", "execute", _wrap_node)
    _install(state, utils, "comfy.utils", "copy_to_param", _wrap_param_write)
    _install(state, patcher_cls, "comfy.model_patcher.ModelPatcher", "patch_weight_to_device",
             _wrap_patcher_write)
    _install(state, patcher_cls, "comfy.model_patcher.ModelPatcher", "patch_hook_weight_to_device",
             _wrap_patcher_write)
    _install(state, mm, "comfy.model_management", "free_memory", _wrap_free_memory)
    # Newer ComfyUI only: its own pin eviction and RAM-cache release.
    if mm is not None and hasattr(mm, "free_pins"):
        _install(state, mm, "comfy.model_management", "free_pins", _wrap_comfy_free_pins)
    if memory is not None and hasattr(memory, "extra_ram_release"):
        _install(state, memory, "comfy.memory_management", "extra_ram_release", _wrap_ram_release)


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
            pins_id = pins.register_model(name, device, fast_disk=state.options["fast_disk"])
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


# --- prompt and node boundaries ---------------------------------------------------

def _prompt_started(state: _Integration) -> None:
    pins.mark_prompt([])
    state.prompt_open = True


def _prompt_ended(state: _Integration) -> None:
    state.prompt_open = False
    pins.end_prompt()
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("torch_pins.comfy: prompt done\n%s", pins.summary())


def _wrap_prompt(original):
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def run_prompt(self, *args, **kwargs):
            state = _state
            if state is None:
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
        if state is None:
            return original(self, *args, **kwargs)
        _prompt_started(state)
        try:
            return original(self, *args, **kwargs)
        finally:
            _prompt_ended(state)
    return run_prompt_sync


def _wrap_node(original):
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def execute(*args, **kwargs):
            try:
                return await original(*args, **kwargs)
            finally:
                if _state is not None:
                    pins.end_node()
        return execute

    @functools.wraps(original)
    def execute_sync(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            if _state is not None:
                pins.end_node()
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


def _wrap_cast_bias_weight(original):
    params = inspect.signature(original).parameters
    offloadable_at = list(params).index("offloadable") if "offloadable" in params else None

    @functools.wraps(original)
    def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None, *args, **kwargs):
        state = _state
        if state is None:
            return original(s, input, dtype, device, bias_dtype, *args, **kwargs)
        try:
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
        offloadable = kwargs.get("offloadable", False)
        if offloadable_at is not None and len(args) > offloadable_at - 5:
            offloadable = args[offloadable_at - 5]
        # The copies ran on the current stream: nothing for uncast_bias_weight to wait for.
        return (w, b, None) if offloadable else (w, b)
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
            out = pins.cast_to_device(tensor, device, dtype, _non_blocking(device), ctx.model, "patches",
                                      False, ctx.signature)
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
        ram = float(bound.get("ram_required", 0) or 0) + float(bound.get("pins_required", 0) or 0)
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
    @functools.wraps(original)
    def free_pins(size, *args, **kwargs):
        state = _state
        if state is None or size <= 0:
            return original(size, *args, **kwargs)
        ours = int(pins.free_pins(min(int(size), _MAX_BYTES)))  # a cache: freed before ComfyUI's own pins
        state.count("ram_freed_bytes", ours)
        if ours >= size:
            return ours
        return ours + original(size - ours, *args, **kwargs)
    return free_pins


def _wrap_ram_release(original):
    @functools.wraps(original)
    def extra_ram_release(size, *args, **kwargs):
        state = _state
        if state is not None:
            _relieve(state, size)
        return original(size, *args, **kwargs)
    return extra_ram_release
