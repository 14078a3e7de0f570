"""The dynamic-VRAM cast path (Note [ComfyUI as pins' host]).

Models are ``ModelPatcherDynamic`` and cast through
``comfy.ops.cast_modules_with_vbar`` (the prefetcher calls it too), which asks
``comfy.pinned_memory.get_pin`` for a pin of the layer (subset ``weights`` or
``weights-loaded``), makes one with ``pin_memory`` and copies with
``comfy.model_management.cast_to_gathered``. For a layer of a registered model
``get_pin`` and ``pin_memory`` answer "no pin" (remembering the layer and the
subset for this thread) and ``cast_to_gathered`` copies the layer's weight and
bias into ComfyUI's destination (its vbar or cast buffer) through pins, with
``out=`` on the stream ComfyUI chose, ``resident`` for ``-loaded``. Lowvram
LoRA patches (``LowVramPatch`` sources) of a layer pins serves go through pins
too (``patches``): ``get_pin``/``pin_memory`` answer "no pin" for the patch,
and each factor ComfyUI then copies into its cast buffer
(``comfy.lora.prefetch_prepared_value`` through ``cast_to_gathered``) is served
from a pin of kind ``patches``, ``resident`` for ``patches-loaded``, signed by
the patch set (patches). Unregistered modules keep ComfyUI's own path. A
layer's weight and bias share one pin and one host-to-device transfer
(``cast_many_to_device``), as ComfyUI's gathered copy does; the two parts are
then copied into ComfyUI's destination on the device."""
import functools
import logging
import sys
from typing import Any, Optional

import torch

import torch_pins as pins

from . import casting, patches
from .. import _subclass
from .state import Integration, count, current, log_once


def _serves_layer(state: Integration, module: Any) -> bool:
    return isinstance(module, torch.nn.Module) and state.owner.get(module) is not None


def _layer_bytes(module: Any) -> int:
    """What ComfyUI counts to register a layer's pin: its aligned weight and bias."""
    tensors = [getattr(module, "weight", None), getattr(module, "bias", None)]
    aligned = getattr(sys.modules.get("comfy.memory_management"), "vram_aligned_size", None)
    if aligned is not None:
        return int(aligned(tensors))
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _comfy_pin_call(state: Optional[Integration], original, *args, **kwargs):
    """ComfyUI's own pin call: its page-lock requests are its own (budget)."""
    if state is None:
        return original(*args, **kwargs)
    state.vbar.comfy_pin += 1
    try:
        return original(*args, **kwargs)
    finally:
        state.vbar.comfy_pin -= 1


def _tensor_ids(value: Any, out: set) -> set:
    """The ids of the tensors in a patch value (tensors, tuples, lists, a weight
    adapter's ``weights``), as comfy.lora.prefetch_prepared_value walks it."""
    if isinstance(value, torch.Tensor):
        out.add(id(value))
    elif isinstance(value, (tuple, list)):
        for v in value:
            _tensor_ids(v, out)
    elif hasattr(value, "weights"):
        _tensor_ids(value.weights, out)
    return out


def _serves_patch(state: Integration, patch: Any, subset: str) -> bool:
    """A lowvram patch of the layer pins serves: remembered for its factors' copies."""
    ctx = state.vbar
    if not getattr(patch, "is_lowvram_patch", False) or ctx.layer_entry is None or not state.options["patches"]:
        return False
    if ctx.patch is not patch:
        listed = getattr(patch, "patches", {}).get(getattr(patch, "key", None), ())
        ctx.patch_tensors = _tensor_ids([p[1] for p in listed if isinstance(p, tuple) and len(p) > 1], set())
        if ctx.prefetch:
            ctx.served += int(patch.memory_required())
    ctx.patch, ctx.patch_subset = patch, subset
    return True


def wrap_get_pin(original):
    @functools.wraps(original)
    def get_pin(module, subset="weights", *args, **kwargs):
        state = current()
        if state is not None and isinstance(module, torch.nn.Module):
            state.vbar.layer_entry, state.vbar.patch = state.owner.get(module), None
        if state is not None and _serves_patch(state, module, subset):
            return None  # pins holds the patch's factors: cast_to_gathered copies them through it
        if state is not None and _serves_layer(state, module):
            ctx = state.vbar
            if ctx.prefetch and ctx.module is not module:  # once per layer, whatever the subsets asked
                ctx.served += _layer_bytes(module)
            # pin_memory, then get_pin again for the pin it made: still wanted
            ctx.wanted = ctx.wanted and ctx.module is module and ctx.subset == subset
            ctx.module, ctx.subset = module, subset
            return None  # pins holds the layer's pin: cast_to_gathered copies through it
        return _comfy_pin_call(state, original, module, subset, *args, **kwargs)
    return get_pin


def wrap_pin_memory(original):
    @functools.wraps(original)
    def pin_memory(module, subset="weights", *args, **kwargs):
        state = current()
        if state is not None and _serves_patch(state, module, subset):
            count("declined_pins")
            return None
        if state is not None and _serves_layer(state, module):
            state.vbar.module, state.vbar.subset, state.vbar.wanted = module, subset, True
            count("declined_pins")
            return None
        return _comfy_pin_call(state, original, module, subset, *args, **kwargs)
    return pin_memory


def _vbar_cast(state: Integration, tensors: Any, r: Any, r2: Any, non_blocking: bool, stream: Any) -> Optional[str]:
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
    if state.options["comfy_fast_disk"] and (subset.endswith("-loaded") or not ctx.wanted):
        # --fast-disk: ComfyUI pins no layer that keeps a place in VRAM (it asks
        # pin_memory only for the others): copied from its source, as ComfyUI's.
        return "fast-disk"
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 2 \
            or tensors[0] is not getattr(module, "weight", None) or tensors[1] is not getattr(module, "bias", None):
        return "vbar-sources"
    dest = r2 if r is None else (r if r2 is None else None)
    if not isinstance(dest, torch.Tensor):
        return "vbar-destination"
    if dest.device.type == "cpu" and not state.options["cpu_targets"]:
        return "cpu-target"
    if any(t is not None and not casting.is_cpu(t) for t in tensors):
        return "not-cpu"
    memory = sys.modules.get("comfy.memory_management")
    views = memory.interpret_gathered_like(list(tensors), dest)
    resident = subset.endswith("-loaded")
    present = [(t, view) for t, view in zip(tensors, views) if t is not None]
    with casting.stream_context(stream):
        if len(present) > 1 and state.options["gather"] and not any(_subclass.is_wrapper(t) for t, _ in present):
            # One pin and one host-to-device transfer for the layer, as ComfyUI's
            # gathered copy; the parts then go into its destination on the device.
            cast = pins.cast_many_to_device([t for t, _ in present], dest.device, None, non_blocking,
                                            entry.pins_id, "weights", resident)
            for (_, view), part in zip(present, cast):
                view.copy_(part, non_blocking=non_blocking)
            count("gathered")
        else:
            for t, view in present:
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


def _patch_cast(state: Integration, tensors: Any, r: Any, r2: Any, non_blocking: bool, stream: Any) -> bool:
    """Copies a factor of the lowvram patch pins serves into ComfyUI's cast
    buffer through a pin of kind ``patches``; False when it is not one."""
    ctx = state.vbar
    if ctx.patch is None or r2 is not None or not isinstance(r, torch.Tensor) or \
            not isinstance(tensors, (list, tuple)) or len(tensors) != 1 or id(tensors[0]) not in ctx.patch_tensors:
        return False
    t = tensors[0]
    if not casting.is_cpu(t) or _subclass.is_wrapper(t) or \
            (r.device.type == "cpu" and not state.options["cpu_targets"]):
        return False
    entry = ctx.layer_entry
    view = sys.modules.get("comfy.memory_management").interpret_gathered_like([t], r)[0]
    with casting.stream_context(stream):
        pins.cast_to_device(t, view.device, None, non_blocking, entry.pins_id, "patches",
                            ctx.patch_subset.endswith("-loaded"), patches.signature(entry, [ctx.patch]), out=view)
    mark = getattr(sys.modules.get("comfy.model_management"), "mark_mmap_dirty", None)
    if mark is not None:
        mark(t.untyped_storage())
    return True


def wrap_cast_to_gathered(original):
    @functools.wraps(original)
    def cast_to_gathered(tensors, r, non_blocking=False, stream=None, r2=None):
        state = current()
        if state is None:
            return original(tensors, r, non_blocking=non_blocking, stream=stream, r2=r2)
        try:
            if _patch_cast(state, tensors, r, r2, non_blocking, stream):
                count("vbar_patch_casts")
                return None
            why = _vbar_cast(state, tensors, r, r2, non_blocking, stream)
        except Exception as e:
            count("errors")
            log_once(logging.WARNING, f"pins: vbar cast through pins failed, ComfyUI casts "
                                      f"instead: {type(e).__name__}: {e}")
            why = "error"
        if why is None:
            count("vbar_casts")
            return None
        if why != "vbar-no-layer":  # not a layer's weights (a patch, ComfyUI's own pin): not counted
            count(f"fallback.{why}")
        return original(tensors, r, non_blocking=non_blocking, stream=stream, r2=r2)
    return cast_to_gathered
