"""ComfyUI-GGUF's layers through pins.

Note [ComfyUI-GGUF]
~~~~~~~~~~~~~~~~~~~
ComfyUI-GGUF (city96) keeps a GGUF file's tensors as ``GGMLTensor``: a plain
tensor subclass over the file's raw bytes (quantized blocks, or F16/F32 values)
with ``tensor_type`` and ``tensor_shape`` as attributes. Its layers
(``GGMLLayer``, mixed into ComfyUI's manual_cast ops by ``GGMLOps``) cast
their own weights: ``GGMLLayer.cast_bias_weight`` moves the bias and the
weight to the device with the tensor's own ``.to(device)`` and dequantizes
them there, never calling ``comfy.ops.cast_bias_weight``. So pins hooks those
two: the layer's cast marks, for this thread, the layer whose tensors it moves
(when its model is registered), and within it ``GGMLTensor.to`` moves that
layer's weight or bias through pins (its pin, ``model`` the layer's), which
gives back what ``GGMLTensor.to`` gives (its class, ``tensor_type``,
``tensor_shape``, a copy of its patch list: Note [Plain subclasses] in
_subclass.py); ComfyUI-GGUF then dequantizes the same bytes. Any other
``.to`` of a GGMLTensor (its patcher's loads and LoRA patches, a layer pins
does not serve) is ComfyUI-GGUF's own. A move to the CPU is served only with
``enable(cpu_targets=True)``, where it is served even though
``GGMLTensor.to`` would hand the tensor itself over (ComfyUI's old loader does
not serve such a cast): the same path as to an accelerator, which lets a
machine without one exercise it. While Dynamo traces (torch.compile of a GGUF
model) the hooks stand aside, and the layer casts as without pins.

The node is found as ComfyUI loads it, by what it is rather than by its
directory's name (ComfyUI imports a custom node under its path): the module
named ``<node>.ops`` that defines ``GGMLLayer`` and ``GGMLTensor``
(:func:`find_ops`); ``nodes.load_custom_node`` is hooked so that a node loaded
after ``enable()`` gets its hooks when it is loaded."""
import functools
import inspect
import logging
import sys
import threading
from typing import Any, Optional, Tuple

import torch

import torch_pins as pins

from . import casting
from .state import Integration, count, current, enable_lock, log_once

NAME = "ComfyUI-GGUF.ops"  # the name of its hook points (its module's own name is its path)


class LayerContext(threading.local):
    """The GGMLLayer whose cast runs on this thread, when pins serves it."""
    module: Any = None


_layer = LayerContext()


def find_ops() -> Optional[Any]:
    """ComfyUI-GGUF's ops module where it is imported (the one imported last,
    should there be two), else None."""
    for name, module in reversed(list(sys.modules.items())):
        if module is None or not name.endswith(".ops"):
            continue
        layer, tensor = getattr(module, "GGMLLayer", None), getattr(module, "GGMLTensor", None)
        if isinstance(layer, type) and issubclass(layer, torch.nn.Module) and hasattr(layer, "cast_bias_weight") \
                and isinstance(tensor, type) and issubclass(tensor, torch.Tensor):
            return module
    return None


def wrap_layer_cast(original):
    @functools.wraps(original)
    def cast_bias_weight(s, *args, **kwargs):
        state = current()
        if state is None or torch.compiler.is_compiling():
            return original(s, *args, **kwargs)
        if not isinstance(s, torch.nn.Module) or state.owner.get(s) is None:
            count("fallback.unregistered")
            return original(s, *args, **kwargs)
        saved, _layer.module = _layer.module, s
        try:
            return original(s, *args, **kwargs)
        finally:
            _layer.module = saved
    return cast_bias_weight


def _device_move(args: Any, kwargs: Any) -> Optional[Tuple[torch.device, bool]]:
    """The device (and non_blocking) of a ``.to(device)`` that only moves (no
    dtype, no copy=, no memory format), else None."""
    if "copy" in kwargs:
        return None
    try:
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    except Exception:  # noqa: BLE001  (an unusual call: GGMLTensor's own .to answers it)
        return None
    return (device, bool(non_blocking)) if device is not None and dtype is None and memory_format is None else None


def _serve(state: Integration, t: torch.Tensor, device: torch.device, non_blocking: bool) -> Any:
    """The weight or bias of the marked layer moved through pins; a string says why not."""
    if device.type == "cpu" and not state.options["cpu_targets"]:
        return "cpu-target"
    if not casting.is_cpu(t):
        return "not-cpu"
    entry = state.owner.get(_layer.module)
    if entry is None:
        return "unregistered"
    return pins.cast_to_device(t, device, None, non_blocking, entry.pins_id)


def wrap_tensor_to(original):
    @functools.wraps(original)
    def to(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return original(self, *args, **kwargs)
        module = _layer.module
        if module is None or all(self is not getattr(module, name, None) for name in ("weight", "bias")):
            return original(self, *args, **kwargs)
        state = current()
        move = _device_move(args, kwargs)
        if state is None or move is None:
            return original(self, *args, **kwargs)
        try:
            out = _serve(state, self, *move)
        except Exception as e:
            count("errors")
            log_once(logging.WARNING, f"pins: GGUF cast through pins failed, ComfyUI-GGUF casts "
                                      f"instead: {type(e).__name__}: {e}")
            out = "error"
        if isinstance(out, str):
            count(f"fallback.{out}")
            return original(self, *args, **kwargs)
        count("gguf_casts")
        return out
    return to


def wrap_load_custom_node(original, install):
    """``nodes.load_custom_node``: after a node is loaded, the hooks of the
    nodes pins knows (ComfyUI-GGUF) that it brought go in (``install``)."""
    def arrived():
        with enable_lock:
            state = current()
            if state is not None:
                install(state)

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def load_custom_node(*args, **kwargs):
            try:
                return await original(*args, **kwargs)
            finally:
                arrived()
        return load_custom_node

    @functools.wraps(original)
    def load_custom_node_sync(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            arrived()
    return load_custom_node_sync
