"""Fake (meta) kernels of the pins ops, for torch.compile and FakeTensor tracing.

torch imports this module by name when tracing needs a fake kernel
(``m.set_python_module("torch_pins._fake")`` in ops/library.cpp)."""
import torch

from . import _library

_library.load()


@torch.library.register_fake("pins::cast_to_device")
def _cast_to_device_fake(source, device, dtype=None, non_blocking=False, model=-1, kind="weights",
                         resident=False, signature=None):
    torch._check_value(source.device.type == "cpu", lambda: f"cast_to_device: source must be a CPU tensor, got device {source.device}")
    return torch.empty(source.shape, dtype=dtype if dtype is not None else source.dtype, device=device)
