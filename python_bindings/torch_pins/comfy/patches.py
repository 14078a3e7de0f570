"""LoRA factors through pins. ComfyUI's lowvram patch functions bring their
factors to the weight's device with ``comfy.model_management.cast_to_device``:
inside a patch function run by ``cast_bias_weight`` (old_loader), factors go
through pins with ``kind="patches"``, ``resident`` (so they land in
``patches-loaded`` and stay across nodes and prompts while the patch set is
unchanged, within the budget) and the patch set's signature: the patched
model's ``current_weight_patches_uuid`` (ComfyUI renews it whenever the patch
set changes), else a hash of the patch list."""
import contextlib
import functools
import logging
from typing import Any, Iterator, List

import torch

import torch_pins as pins

from . import casting
from .. import _subclass
from .state import MASK63, Integration, ModelEntry, count, current, log_once


def signature(entry: ModelEntry, functions: List[Any]) -> int:
    """The patch set's signature: the model's ``current_weight_patches_uuid``,
    else a hash of the patches these patch functions apply."""
    module = entry.module()
    uuid = getattr(module, "current_weight_patches_uuid", None)
    if uuid is not None and hasattr(uuid, "int"):
        return uuid.int & MASK63
    parts = []
    for f in functions:
        patches = getattr(f, "patches", None)
        key = getattr(f, "key", None)
        listed = patches.get(key, ()) if isinstance(patches, dict) else ()
        parts.append((key, tuple((p[0], id(p[1]), p[2]) for p in listed if isinstance(p, tuple) and len(p) >= 3)))
    return hash(tuple(parts)) & MASK63


@contextlib.contextmanager
def scope(state: Integration, entry: ModelEntry, functions: List[Any]) -> Iterator[None]:
    """While a module's patch functions run: their factors' casts go through pins."""
    ctx = state.patch
    saved = (ctx.active, ctx.model, ctx.signature)
    ctx.active, ctx.model, ctx.signature = True, entry.pins_id, signature(entry, functions)
    try:
        yield
    finally:
        ctx.active, ctx.model, ctx.signature = saved


def wrap_patch_cast(original):
    @functools.wraps(original)
    def cast_to_device(tensor, device, dtype, copy=False):
        state = current()
        if state is None or not state.patch.active or not isinstance(tensor, torch.Tensor) \
                or _subclass.is_wrapper(tensor):
            return original(tensor, device, dtype, copy)
        device = torch.device(device)
        if casting.wants_copy(state, tensor, device, dtype, copy) is not None:
            return original(tensor, device, dtype, copy)
        ctx = state.patch
        try:
            # resident: patches-loaded, kept across nodes and prompts while the
            # patch set (the signature) is unchanged.
            out = pins.cast_to_device(tensor, device, dtype, casting.non_blocking(device), ctx.model, "patches",
                                      True, ctx.signature)
        except Exception as e:
            count("errors")
            log_once(logging.WARNING, f"pins: patch cast through pins failed: "
                                      f"{type(e).__name__}: {e}")
            return original(tensor, device, dtype, copy)
        count("patch_casts")
        return out
    return cast_to_device
