"""What the cast paths share (old_loader, dynamic_vram, patches): which casts
pins serves, ComfyUI's streams and non-blocking rule, and ComfyUI's handling of
a quantized weight (``QuantizedTensor``) once cast."""
import contextlib
import sys
from typing import Any, Optional

import torch

from .state import Integration


def is_cpu(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def wants_copy(state: Integration, source: torch.Tensor, device: torch.device, dtype: Optional[torch.dtype],
               copy: bool) -> Optional[str]:
    """None when pins should serve a cast of ``source`` to ``device``, else why not."""
    if not is_cpu(source):
        return "not-cpu"
    if device.type == "cpu":
        if not state.options["cpu_targets"]:
            return "cpu-target"
        if not copy and (dtype is None or dtype == source.dtype):
            return "no-copy"  # ComfyUI hands the tensor itself over
    return None


def non_blocking(device: torch.device) -> bool:
    mm = sys.modules.get("comfy.model_management")
    probe = getattr(mm, "device_supports_non_blocking", None)
    try:
        return bool(probe(device)) if probe is not None else device.type == "cuda"
    except Exception:
        return False


def quantized_type() -> Optional[type]:
    """ComfyUI's QuantizedTensor where this ComfyUI has one."""
    quant = sys.modules.get("comfy.quant_ops")
    cls = getattr(quant, "QuantizedTensor", None)
    return cls if isinstance(cls, type) and issubclass(cls, torch.Tensor) else None


def finish_wrapper(t: torch.Tensor, dtype: Optional[torch.dtype], has_function: bool) -> torch.Tensor:
    # As ComfyUI does with a quantized weight it cast: keep it quantized unless
    # the compute dtype or a patch function needs plain values.
    if dtype is not None and (has_function or t.dtype != dtype):
        t = t.to(dtype)
        quantized = quantized_type()
        if quantized is not None and isinstance(t, quantized):
            t = t.dequantize()
    return t


def stream_context(stream: Any) -> Any:
    """Entering ``stream`` as ComfyUI does (``as_context`` where it has one)."""
    if stream is None:
        return contextlib.nullcontext()
    return stream.as_context(stream) if hasattr(stream, "as_context") else stream


def offload_stream(device: Any) -> Any:
    """ComfyUI's offload stream for ``device`` (None where it has none: the CPU,
    streams off, an older ComfyUI)."""
    mm = sys.modules.get("comfy.model_management")
    get = getattr(mm, "get_offload_stream", None)
    if get is None or device is None:
        return None
    return get(torch.device(device))
