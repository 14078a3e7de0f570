"""The hook registry: what pins hooks in ComfyUI, and the code that puts each
hook in and takes it out again.

Note [ComfyUI hook points]
~~~~~~~~~~~~~~~~~~~~~~~~~~
:data:`TABLE` lists every function of ComfyUI pins wraps, by name, with the
tested ComfyUI releases that have it and what pins does there (docs/USAGE.md
"ComfyUI" shows the same table; a test keeps the two equal); the wrapper comes
from the module of its concern. :func:`install_all` looks each one up by name
where the running ComfyUI has it, importing its module or awaiting it
(versions), and replaces it with a wrapper that calls the original and pins
around it; :func:`uninstall` puts every original back (an inherited method by
deleting the class's own attribute). ``enable()`` returns a :class:`Hooks`: the
names of the hooks in, with ``missing`` (absent here), ``failed`` (modules that
raised), ``awaited``, and ``active``, false (and a warning says why) when the
hooks that make pins serve casts are missing. Errors from pins in a cast are
not ComfyUI's: the cast falls back to the original, the error is counted
(``errors``) and logged once per message."""
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import budget, dynamic_vram, gguf, lifecycle, loading, models, old_loader, patches, versions, writes
from .state import Integration, current, enable_lock, log

# The ComfyUI releases the tests run against (tests/python/test_comfy.py).
BOTH = "0.3.64, 0.33"
NEWER = "0.33"
GGUF = "0.3.64, 0.33 with ComfyUI-GGUF 795e451"  # the custom node, at the commit the tests ran


class HookPoint(NamedTuple):
    module: str
    cls: str        # "" for a module-level function
    attr: str
    wrap: Callable[[Any], Any]  # original -> wrapper
    # "register", and "cast" (old loader) / "vbar" (dynamic VRAM), make pins
    # serve casts (Hooks.active); the rest refine what it does.
    role: str
    releases: str   # the tested ComfyUI releases that have it
    does: str       # what pins does there
    option: str = ""  # the enable() option it needs on
    # For a custom node's module, which ComfyUI imports under its path: finds
    # it where it is imported (None: not loaded, which is no miss).
    locate: Optional[Callable[[], Any]] = None

    @property
    def name(self) -> str:
        return ".".join(p for p in (self.module, self.cls, self.attr) if p)


def _load(module: str) -> HookPoint:
    if module == "comfy.utils":
        does = ("a safetensors file loaded to the CPU is read with `pins.load_file`: ComfyUI's dict over a mapping "
                "pins knows, so a pin of its tensors is filled from the file; other files are ComfyUI's loader's "
                "(`load_fallback.<reason>`)")
    else:
        does = "the same, for the copy of `comfy.utils.load_torch_file` this module took by name at import"
    return HookPoint(module, "", "load_torch_file", loading.wrap_load_torch_file, "load",
                     NEWER if module == "comfy.bg_removal_model" else BOTH, does, "load_files")


MP, MM = "comfy.model_patcher", "comfy.model_management"
TABLE: Tuple[HookPoint, ...] = (
    HookPoint(MP, "ModelPatcher", "__init__", models.wrap_patcher_init, "register", BOTH,
              "registers a pins model per weight module (clones share it), named after its class, with the "
              "patcher's load device and its weights' bytes (ComfyUI's cached size, else counted by pins: never "
              "`model_size()`, whose result ComfyUI keeps); forgotten when the module is garbage collected"),
    HookPoint("comfy.ops", "", "cast_bias_weight", old_loader.wrap_cast_bias_weight, "cast", BOTH,
              "old loader: a registered module's CPU weight and bias go to the device through pins, in one pin "
              "and one transfer when they share a dtype, on ComfyUI's offload stream where ComfyUI copies on one "
              "(0.33: `offloadable`; 0.3.64: every cast, `--async-offload`), taken only once pins serves the "
              "cast; its lowvram patch functions run on the result"),
    HookPoint("comfy.pinned_memory", "", "get_pin", dynamic_vram.wrap_get_pin, "vbar", NEWER,
              "dynamic VRAM: no pin of ComfyUI's for a layer of a registered model or for its lowvram LoRA "
              "patch; the layer (patch) and subset are remembered for the copy"),
    HookPoint("comfy.pinned_memory", "", "pin_memory", dynamic_vram.wrap_pin_memory, "vbar", NEWER,
              "dynamic VRAM: makes no aimdo host buffer for a layer of a registered model or its patch "
              "(`declined_pins`)"),
    HookPoint(MM, "", "cast_to_gathered", dynamic_vram.wrap_cast_to_gathered, "vbar", NEWER,
              "dynamic VRAM: that layer's weight and bias, one pin and one transfer, go into ComfyUI's "
              "destination through pins, on ComfyUI's stream, `resident` for `weights-loaded`; under "
              "`--fast-disk` a layer ComfyUI would not pin is copied from its source"),
    HookPoint(MM, "", "load_models_gpu", lifecycle.wrap_load_models_gpu, "boundary", BOTH,
              "marks the models a node loads as used by the prompt and active (wakes the prewarm); after "
              "the load, says how much of each stays on the device (`set_device_bytes`: `loaded_size()` of "
              "`model_size()`)"),
    HookPoint(MM, "LoadedModel", "model_unload", lifecycle.wrap_model_unload, "boundary", BOTH,
              "an unloaded model is inactive; its pins stay, the cache it reloads from; after a partial or "
              "whole unload, says how much stays on the device"),
    HookPoint(MM, "", "unload_all_models", lifecycle.wrap_unload_all, "boundary", BOTH,
              "`/free`: every model inactive, every pin freed"),
    HookPoint(MP, "PromptModelTracker", "start", lifecycle.wrap_tracker_start, "boundary", NEWER,
              "the prompt's start (ComfyUI's own tracking)"),
    HookPoint(MP, "PromptModelTracker", "add", lifecycle.wrap_tracker_add, "boundary", NEWER,
              "the models the prompt uses"),
    HookPoint(MP, "PromptModelTracker", "end", lifecycle.wrap_tracker_end, "boundary", NEWER,
              "`end_prompt`"),
    HookPoint(MM, "", "reset_cast_buffers", lifecycle.wrap_reset_cast_buffers, "boundary", NEWER,
              "dynamic VRAM: `end_node`"),
    HookPoint("execution", "PromptExecutor", "execute_async", lifecycle.wrap_prompt, "boundary", BOTH,
              "prompt start and `end_prompt` where ComfyUI's tracker does not run (`execute` on older "
              "executors)"),
    HookPoint("execution", "", "execute", lifecycle.wrap_node, "boundary", BOTH,
              "`end_node` after each node where `reset_cast_buffers` does not end it"),
    HookPoint("comfy.utils", "", "copy_to_param", writes.wrap_param_write, "write", BOTH,
              "`pins.invalidate` on the weight written (through `.data`: no version counter sees it)"),
    HookPoint(MP, "ModelPatcher", "patch_weight_to_device", writes.wrap_patcher_write, "write", BOTH,
              "`pins.invalidate` on the weight a patch was written into"),
    HookPoint(MP, "ModelPatcher", "patch_hook_weight_to_device", writes.wrap_patcher_write, "write", BOTH,
              "`pins.invalidate` on the weight a hook patch was written into"),
    HookPoint(MP, "ModelPatcher", "pin_weight_to_device", budget.wrap_pin_weight, "budget", NEWER,
              "old loader: does nothing for a registered model (`declined_pins`): no second, page-locked copy"),
    HookPoint(MM, "", "free_memory", budget.wrap_free_memory, "budget", BOTH,
              "frees pins for RAM asked for (`ram_required`, a CPU device) before ComfyUI unloads models, and "
              "keeps `ram_headroom` after an accelerator's models came back to RAM"),
    HookPoint(MM, "", "free_pins", budget.wrap_free_pins, "budget", NEWER,
              "ComfyUI's pin eviction: pins' pins along the same tiers first, ComfyUI's own after"),
    HookPoint(MM, "", "ensure_pin_registerable", budget.wrap_pin_registerable, "budget", NEWER,
              "ComfyUI's page-lock cap counts pins' page-locked bytes too, once: the layers pins served are taken "
              "off the prefetcher's request"),
    HookPoint("comfy.model_prefetch", "", "prefetch_queue_pop", budget.wrap_prefetch, "budget", NEWER,
              "counts the layers pins serves while ComfyUI prefetches, for `ensure_pin_registerable`"),
    HookPoint(MM, "", "cast_to_device", patches.wrap_patch_cast, "cast", BOTH,
              "inside a lowvram patch function, LoRA factors go through pins as `kind=\"patches\"`, `resident`, "
              "signed by the patch set: kept in `patches-loaded` while it is unchanged", "patches"),
    _load("comfy.utils"),
    _load("comfy.clip_vision"),
    _load("comfy.bg_removal_model"),
    HookPoint("nodes", "", "load_custom_node", lambda original: gguf.wrap_load_custom_node(original, install_all),
              "load", BOTH, "after ComfyUI loads a custom node: the hooks of ComfyUI-GGUF's below go in if it was "
              "that node"),
    HookPoint(gguf.NAME, "GGMLLayer", "cast_bias_weight", gguf.wrap_layer_cast, "cast", GGUF,
              "ComfyUI-GGUF: marks, for this thread, the layer of a registered model whose weight and bias the "
              "cast moves", locate=gguf.find_ops),
    HookPoint(gguf.NAME, "GGMLTensor", "to", gguf.wrap_tensor_to, "cast", GGUF,
              "within that cast, the layer's weight and bias (quantized or F16/F32) go to the device through pins "
              "and come back as `GGMLTensor.to` gives them (`tensor_type`, `tensor_shape`, patch list); ComfyUI-GGUF "
              "dequantizes them as without pins", locate=gguf.find_ops),
)


def points(options: Dict[str, Any]) -> List[HookPoint]:
    """The rows of TABLE that these enable() options turn on."""
    return [p for p in TABLE if not p.option or options[p.option]]


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


class Hook:
    """One attribute replaced on a module or class, and how to put it back."""

    def __init__(self, owner: Any, name: str, original: Any, had_own: bool):
        self.owner, self.name, self.original, self.had_own = owner, name, original, had_own

    def restore(self) -> None:
        if self.had_own:
            setattr(self.owner, self.name, self.original)
        else:  # the original was inherited: drop ours so lookup finds it again
            delattr(self.owner, self.name)


def install_all(state: Integration) -> None:
    """Installs every hook point whose module is here and that is not in yet."""
    state.missing = []
    executor = sys.modules.get("execution")
    for point in points(state.options):
        module_name, cls_name, attr, name = point.module, point.cls, point.attr, point.name
        if name in state.hooks:
            continue
        if module_name == "execution" and cls_name == "PromptExecutor" and executor is not None:
            # Older executors have only the synchronous form.
            cls = getattr(executor, "PromptExecutor", None)
            if cls is not None and not hasattr(cls, "execute_async"):
                attr, name = "execute", "execution.PromptExecutor.execute"
                if name in state.hooks:
                    continue
        module = point.locate() if point.locate is not None else versions.import_module(state, module_name)
        if module is None and point.locate is not None:
            continue  # a custom node that is not loaded (yet): no miss
        if module is None:
            if module_name not in state.failed and module_name not in state.awaited:
                if module_name not in versions.OPTIONAL_MODULES:
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
        state.hooks[name] = Hook(owner, attr, original, attr in vars(owner))
        setattr(owner, attr, point.wrap(original))
    state.awaited = {m for m in state.awaited if m not in sys.modules}
    if state.awaited:
        versions.ArrivalFinder.install(_arrived)


def uninstall(state: Integration) -> None:
    for hook in reversed(list(state.hooks.values())):
        hook.restore()
    state.hooks.clear()
    versions.ArrivalFinder.remove()


def _arrived(name: str) -> None:
    with enable_lock:
        state = current()
        if state is None:
            return
        state.awaited.discard(name)
        install_all(state)
        if not state.awaited:
            versions.ArrivalFinder.remove()
        log.info("pins: %s imported, its hooks are in (%d hooks)", name, len(state.hooks))


def _active(state: Integration) -> Tuple[bool, str]:
    have = set(state.hooks)
    if "comfy.model_patcher.ModelPatcher.__init__" not in have:
        return False, "models cannot be registered (comfy.model_patcher.ModelPatcher.__init__ is not hooked)"
    vbar = {p.name for p in TABLE if p.role == "vbar"}
    if state.mode == "dynamic-vram" and not vbar <= have:
        return False, f"dynamic VRAM is on but its cast path is not hooked (missing {sorted(vbar - have)})"
    if state.mode == "old-loader" and "comfy.ops.cast_bias_weight" not in have:
        return False, "no cast is served (comfy.ops.cast_bias_weight is not hooked)"
    return True, ""


def report(state: Integration, reason: Optional[str] = None) -> Hooks:
    """What is in now; with ``reason``, the report of an enable() that stayed out."""
    out = Hooks(state.hooks)
    out.active, out.reason = _active(state) if reason is None else (False, reason)
    out.mode = state.mode
    out.missing = tuple(state.missing)
    out.failed = dict(state.failed)
    out.awaited = tuple(sorted(state.awaited))
    return out
