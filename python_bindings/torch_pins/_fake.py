"""Fake (meta) kernels of the pins ops, for torch.compile and FakeTensor tracing.

torch imports this module by name when tracing needs a fake kernel
(``m.set_python_module("torch_pins._fake")`` in ops/library.cpp)."""
import torch

from . import _library

_library.load()


def _check_source(source, op, argument):
    torch._check_value(source.device.type == "cpu",
                       lambda: f"{op}: {argument} must be a CPU tensor, got device {source.device}")


@torch.library.register_fake("pins::cast_to_device")
def _cast_to_device_fake(source, device, dtype=None, non_blocking=False, model=-1, kind="weights",
                         resident=False, signature=None):
    _check_source(source, "cast_to_device", "source")
    return torch.empty(source.shape, dtype=dtype if dtype is not None else source.dtype, device=device)


@torch.library.register_fake("pins::cast_to_device.out")
def _cast_to_device_out_fake(source, device, dtype=None, non_blocking=False, model=-1, kind="weights",
                             resident=False, signature=None, *, out):
    _check_source(source, "cast_to_device", "source")
    want = dtype if dtype is not None else source.dtype
    torch._check_value(out.device.type == device.type and (device.index is None or out.device.index == device.index),
                       lambda: f"cast_to_device: out must be on the device {device}, got out on {out.device}")
    torch._check_value(out.shape == source.shape,
                       lambda: f"cast_to_device: out must have the source's shape {list(source.shape)}, "
                               f"got out of shape {list(out.shape)}")
    torch._check_value(out.dtype == want, lambda: f"cast_to_device: out must have dtype {want}, got out of dtype {out.dtype}")
    return out


@torch.library.register_fake("pins::cast_many_to_device")
def _cast_many_to_device_fake(sources, device, dtype=None, non_blocking=False, model=-1, kind="weights",
                              resident=False, signature=None):
    for i, s in enumerate(sources):
        _check_source(s, "cast_many_to_device", f"sources[{i}]")
    return [torch.empty(s.shape, dtype=dtype if dtype is not None else s.dtype, device=device) for s in sources]
