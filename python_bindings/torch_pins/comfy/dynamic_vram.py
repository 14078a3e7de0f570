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
LoRA patches (``LowVramPatch`` sources) and unregistered modules keep
ComfyUI's own path."""
import functools
import logging
import sys
from typing import Any, Optional

import torch

import torch_pins as pins

from . import casting
from .. import _subclass
from .state import Integration, count, current, log_once


def _serves_layer(state: Integration, module: Any) -> bool:
    return isinstance(module, torch.nn.Module) and state.owner.get(module) is not None


def wrap_get_pin(original):
    @functools.wraps(original)
    def get_pin(module, subset="weights", *args, **kwargs):
        state = current()
        if state is not None and _serves_layer(state, module):
            state.vbar.module, state.vbar.subset = module, subset
            return None  # pins holds the layer's pin: cast_to_gathered copies through it
        return original(module, subset, *args, **kwargs)
    return get_pin


def wrap_pin_memory(original):
    @functools.wraps(original)
    def pin_memory(module, subset="weights", *args, **kwargs):
        state = current()
        if state is not None and _serves_layer(state, module):
            state.vbar.module, state.vbar.subset = module, subset
            count("declined_pins")
            return None
        return original(module, subset, *args, **kwargs)
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
    with casting.stream_context(stream):
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


def wrap_cast_to_gathered(original):
    @functools.wraps(original)
    def cast_to_gathered(tensors, r, non_blocking=False, stream=None, r2=None):
        state = current()
        if state is None:
            return original(tensors, r, non_blocking=non_blocking, stream=stream, r2=r2)
        try:
            why = _vbar_cast(state, tensors, r, r2, non_blocking, stream)
        except Exception as e:
            count("errors")
            log_once(logging.WARNING, f"torch_pins.comfy: vbar cast through pins failed, ComfyUI casts "
                                      f"instead: {type(e).__name__}: {e}")
            why = "error"
        if why is None:
            count("vbar_casts")
            return None
        if why != "vbar-no-layer":  # not a layer's weights (a patch, ComfyUI's own pin): not counted
            count(f"fallback.{why}")
        return original(tensors, r, non_blocking=non_blocking, stream=stream, r2=r2)
    return cast_to_gathered
