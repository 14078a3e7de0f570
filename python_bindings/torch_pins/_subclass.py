"""Tensor wrapper subclasses through pins: cast the plain tensors inside them.

Note [Wrapper subclasses]
~~~~~~~~~~~~~~~~~~~~~~~~~
A wrapper subclass (ComfyUI's ``QuantizedTensor``, torchao's quantized tensors,
any class made with ``torch.Tensor._make_wrapper_subclass``) has no storage of
its own: its data sits in plain tensors it holds (a quantized payload, its
scales). Handing one to the op as it is gets it dequantized before the op (a new
full-width pin each call, never a hit) or refused. Here such a source is
flattened with ``__tensor_flatten__``, its plain inner tensors are cast through
pins together (one gathered pin and one transfer, keyed by their own storages,
so the next call hits), with no dtype conversion of the payloads, and the
results are put back together with the class's ``__tensor_unflatten__``; a
``dtype`` then applies to the wrapper (``result.to(dtype)``, which the class's
own dispatch interprets). Nested wrappers are flattened recursively. Plain
tensors cast beside wrappers (``cast_many_to_device``) join the same group and
are converted on the device, so a group's pin does not depend on ``dtype``.

A subclass that overrides ``__torch_dispatch__`` but lacks the flatten protocol
hides its data from pins: it is refused with a ``ValueError`` naming its type,
never copied through a fresh pin per call. Subclasses without their own
dispatch (``Parameter``, plain Python subclasses) have real storage and take
the op's ordinary path (Note [Plain subclasses]). Inner tensors on another
device than the CPU (a scale already on the GPU) are moved with ``Tensor.to``,
outside pins.

Note [Plain subclasses]
~~~~~~~~~~~~~~~~~~~~~~~
A plain Python subclass (no dispatch of its own; ComfyUI-GGUF's ``GGMLTensor``)
holds its data in its own storage, and often more in its instance attributes:
GGMLTensor's ``tensor_type`` and ``tensor_shape`` say how to read its raw
quantized bytes. torch hands an op's results back as the class but without
those attributes, so a GGMLTensor came back looking right and read as the
wrong shape. So pins casts a plain alias of the source (the same storage: the
same pin; a class with a ``__torch_function__`` of its own is given the call
as it is, and sees it) and :func:`rebuild` makes the result what the class's
``.to()`` gives: the source's class and its instance attributes (its ``__dict__`` and
``__slots__``, as ``torch.save`` keeps them; not Parameter's mark, which
``.to()`` drops), then, when the class has its own ``to``, that ``to`` on the
result, which is on the device already, so that its own bookkeeping runs
(GGMLTensor copies its patch list) with no copy of the data. ``Parameter``
itself stays plain: its ``.to()`` gives a plain tensor.
"""
import copyreg
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["is_wrapper", "is_plain_subclass", "op_source", "rebuild", "cast_to_device", "cast_many_to_device",
           "inner_tensors"]

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _type_name(t: torch.Tensor) -> str:
    cls = type(t)
    return f"{cls.__module__}.{cls.__qualname__}"


def is_wrapper(t: Any) -> bool:
    """Whether ``t`` is a tensor subclass that pins must take apart (or refuse):
    one with its own ``__torch_dispatch__``. ``Parameter`` and subclasses without
    their own dispatch are plain to pins."""
    if not isinstance(t, torch.Tensor) or type(t) in _PLAIN_TYPES:
        return False
    return is_traceable_wrapper_subclass(t) or \
        getattr(type(t), "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__


def is_plain_subclass(t: Any) -> bool:
    """Whether ``t`` is a plain Python subclass with storage of its own (Note
    [Plain subclasses]): not a wrapper, not torch.Tensor or Parameter."""
    return isinstance(t, torch.Tensor) and type(t) not in _PLAIN_TYPES and not is_wrapper(t)


def _default_torch_function(t: torch.Tensor) -> bool:
    return getattr(type(t).__torch_function__, "__func__", None) is torch.Tensor.__torch_function__.__func__


def op_source(t: torch.Tensor) -> torch.Tensor:
    """What the op is given for a plain subclass ``t``: a torch.Tensor over its
    storage, unless its class has a ``__torch_function__`` of its own, which
    then sees the call (Note [Plain subclasses])."""
    return t.as_subclass(torch.Tensor) if _default_torch_function(t) else t


def rebuild(source: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """What ``source.to(result.device, result.dtype)`` gives, over ``result``'s
    data (Note [Plain subclasses])."""
    cls = type(source)
    if type(result) is cls:  # its own __torch_function__ made one
        out = result
    elif type(result) is torch.Tensor and _default_torch_function(source):
        out = result.as_subclass(cls)
    else:  # its own __torch_function__ chose another type: the class's call
        return result
    out.__dict__.update({k: v for k, v in vars(source).items() if k != "_is_param"})
    for name in copyreg._slotnames(cls):
        if hasattr(source, name):
            setattr(out, name, getattr(source, name))
    if cls.to is not torch.Tensor.to:  # its own .to, on a tensor already there: no copy
        out = out.to(device=result.device, dtype=result.dtype)
    return out


def _check_flattenable(t: torch.Tensor, argument: str) -> None:
    if not is_traceable_wrapper_subclass(t):
        raise ValueError(
            f"{argument} is a {_type_name(t)}, a tensor subclass with its own __torch_dispatch__ "
            "but without __tensor_flatten__/__tensor_unflatten__: pins cannot reach its data; "
            "dequantize it first or give the class the flatten protocol")


def _flatten(t: torch.Tensor) -> Tuple[List[str], Any, List[torch.Tensor]]:
    names, ctx = t.__tensor_flatten__()
    return list(names), ctx, [getattr(t, n) for n in names]


def inner_tensors(t: torch.Tensor) -> List[torch.Tensor]:
    """The plain tensors that hold a wrapper's data, recursively; ``[t]`` for a
    plain tensor. ``ValueError`` for a subclass pins cannot take apart."""
    if not is_wrapper(t):
        return [t]
    _check_flattenable(t, "tensor")
    out: List[torch.Tensor] = []
    for inner in _flatten(t)[2]:
        out.extend(inner_tensors(inner))
    return out


class _Plan:
    """A source taken apart: plain CPU leaves go to pins, everything else is
    moved here; ``build`` puts the source back together from the casts."""

    def __init__(self, source: torch.Tensor, argument: str, leaves: List[torch.Tensor]):
        self.source = source
        self.wrapper = is_wrapper(source)
        if not self.wrapper:
            self.index = len(leaves)
            leaves.append(op_source(source) if is_plain_subclass(source) else source)
            return
        _check_flattenable(source, argument)
        self.names, self.ctx, inner = _flatten(source)
        self.children: List[Any] = []
        for name, t in zip(self.names, inner):
            if is_wrapper(t):
                self.children.append(_Plan(t, f"{argument}.{name}", leaves))
            elif t.device.type == "cpu":
                self.children.append(len(leaves))
                leaves.append(t)
            else:
                self.children.append(t)  # already off the CPU: moved in build

    def build(self, casts: Sequence[torch.Tensor], device: torch.device, non_blocking: bool) -> torch.Tensor:
        if not self.wrapper:
            return rebuild(self.source, casts[self.index]) if is_plain_subclass(self.source) else casts[self.index]
        inner = {}
        for name, child in zip(self.names, self.children):
            if isinstance(child, _Plan):
                inner[name] = child.build(casts, device, non_blocking)
            elif isinstance(child, int):
                inner[name] = casts[child]
            else:
                inner[name] = child.to(device, non_blocking=non_blocking)
        return type(self.source).__tensor_unflatten__(inner, self.ctx, self.source.size(), self.source.stride())


def cast_many_to_device(sources: Sequence[torch.Tensor], device, dtype: Optional[torch.dtype] = None,
                        non_blocking: bool = False, model: int = -1, kind: str = "weights",
                        resident: bool = False, signature: Optional[int] = None) -> List[torch.Tensor]:
    """``pins.cast_many_to_device`` for sources of which some are wrapper
    subclasses: the plain sources and every plain CPU tensor inside the wrappers
    are cast as one group, in one gathered pin and one transfer, with no dtype
    (Note [Wrapper subclasses]); so the group, and its pin, is the same whatever
    ``dtype`` a call asks for. Then plain results are converted to ``dtype`` on
    the device and wrappers get it once rebuilt."""
    import torch_pins as pins  # the package is loaded by the time a cast runs

    device = torch.device(device)
    leaves: List[torch.Tensor] = []
    plans = [_Plan(s, f"sources[{i}]", leaves) for i, s in enumerate(sources)]
    casts = pins.cast_many_to_device(leaves, device, None, non_blocking, model, kind, resident, signature) \
        if leaves else []
    out: List[torch.Tensor] = []
    for plan in plans:
        result = plan.build(casts, device, non_blocking)
        if dtype is not None and result.dtype != dtype:
            result = result.to(dtype)
        out.append(result)
    return out


def cast_to_device(source: torch.Tensor, device, dtype: Optional[torch.dtype] = None, non_blocking: bool = False,
                   model: int = -1, kind: str = "weights", resident: bool = False,
                   signature: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``pins.cast_to_device`` for a wrapper subclass (Note [Wrapper subclasses]).
    With ``out``, a wrapper of the same class and layout, each inner tensor is
    cast into the matching inner tensor of ``out``; ``dtype`` must then be
    ``None`` or ``out``'s dtype."""
    if out is None:
        return cast_many_to_device([source], device, dtype, non_blocking, model, kind, resident, signature)[0]
    return _cast_into(source, out, non_blocking, model, kind, resident, signature, dtype)


def _cast_into(source, out, non_blocking, model, kind, resident, signature, dtype) -> torch.Tensor:
    import torch_pins as pins

    _check_flattenable(source, "source")
    if type(out) is not type(source) or not is_traceable_wrapper_subclass(out):
        raise ValueError(f"out must be a {_type_name(source)} like the source, got {_type_name(out)}")
    if dtype is not None and dtype != out.dtype:
        raise ValueError(f"dtype must be None or out's dtype {out.dtype} for a wrapper subclass source, got {dtype}")
    names, _, inner = _flatten(source)
    out_names, _, out_inner = _flatten(out)
    if names != out_names:
        raise ValueError(f"out holds the inner tensors {out_names}, the source {names}: not the same layout")
    for name, src, dst in zip(names, inner, out_inner):
        if is_wrapper(src):
            _cast_into(src, dst, non_blocking, model, kind, resident, signature, None)
        elif src.device.type == "cpu":
            pins.cast_to_device(src, dst.device, None, non_blocking, model, kind, resident, signature, out=dst)
        else:
            dst.copy_(src, non_blocking=non_blocking)
    return out
