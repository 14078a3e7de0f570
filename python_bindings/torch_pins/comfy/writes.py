"""Writes of weights that bypass the version counter (``.data``; and inference
tensors have none): after ``comfy.utils.copy_to_param`` and
``ModelPatcher.patch_weight_to_device`` / ``patch_hook_weight_to_device``,
``pins.invalidate`` on the written tensor. Writes no hook sees are left to the
content check on a hit, if configured, and to ``pins.invalidate``."""
import functools
import inspect
from typing import Any

import torch_pins as pins

from .. import _subclass
from .casting import is_cpu
from .state import Integration, count, current


def _invalidate(state: Integration, tensor: Any) -> None:
    if not is_cpu(tensor):
        return
    try:
        leaves = _subclass.inner_tensors(tensor)
    except ValueError:
        return
    for t in leaves:
        if is_cpu(t):
            count("invalidations")
            count("invalidated_bytes", int(pins.invalidate(t)))


def _attr(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def wrap_param_write(original):
    @functools.wraps(original)
    def write(obj, attr, value, *args, **kwargs):
        result = original(obj, attr, value, *args, **kwargs)
        state = current()
        if state is not None:
            _invalidate(state, _attr(obj, attr))
        return result
    return write


def wrap_patcher_write(original):
    signature = inspect.signature(original)
    patches_param = "combined_patches" if "combined_patches" in signature.parameters else None

    @functools.wraps(original)
    def write(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state = current()
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
