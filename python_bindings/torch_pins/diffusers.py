"""pins for diffusers pipelines: ``torch_pins.diffusers.enable(pipe)``.

diffusers is an optional dependency: importing this module without it raises
ImportError saying how to install it.

Note [Streamed pipelines]
~~~~~~~~~~~~~~~~~~~~~~~~~
:func:`enable` streams every component of a ``DiffusionPipeline`` that is a
``torch.nn.Module`` with :func:`torch_pins.nn.stream` (one pins model per
component, named ``<Pipeline>.<component>``, its weights left on the CPU), and
gives the pipeline a subclass of its own class, made once per class and named
the same, whose members answer for pins:

| member | with pins |
| --- | --- |
| ``__call__`` | one pins prompt around the call, its components' models marked (in a prompt the caller opened: marks only); a component replaced since is streamed first |
| ``_execution_device`` | the device the components stream to, where the pipeline makes its latents |
| ``to`` | a dtype converts as before (the new tensors are pinned afresh); a device other than the CPU is refused: the weights stay on the CPU |
| ``enable_model_cpu_offload``, ``enable_sequential_cpu_offload``, ``enable_group_offload`` | refused, naming :func:`disable` |

:func:`disable` puts the class back and unstreams the components (freeing
their pins): the pipeline is as before. The hooks are torch's forward hooks
(Note [Streamed modules]), not diffusers' ``HookRegistry``: torch's run the
release when a forward raises (``always_call``), the registry's wrapper does
not. diffusers' own offload modes find theirs by name (the registry's
``group_offloading``, accelerate's ``_hf_hook``): :func:`enable` refuses a
pipeline that has one, and the class above refuses to add one. Pipelines
sharing a component (``DiffusionPipeline.from_pipe``) share its streaming and
pins model; all pipelines of a process share pins' one budget.
"""
import weakref
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

try:
    from diffusers import DiffusionPipeline
except ImportError as e:  # pragma: no cover - the message is the feature
    raise ImportError("torch_pins.diffusers needs diffusers, an optional dependency of torch-pins: "
                      "pip install diffusers accelerate") from e

from . import end_prompt, mark_prompt, stats
from . import nn as pins_nn

__all__ = ["enable", "disable", "enabled", "StreamedPipeline"]

_STATE = "_torch_pins"
_subclasses: Dict[type, type] = {}
# A module enable() streamed -> the enabled pipelines that use it.
_users: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()


class StreamedPipeline:
    """What :func:`enable` did to a pipeline: ``device``, ``level``,
    ``prefetch`` and ``components`` (name -> :class:`torch_pins.nn.Streaming`)."""

    def __init__(self, base: type, device: torch.device, level: str, prefetch: Optional[int]):
        self.base = base  # the pipeline's own class
        self.name = base.__name__
        self.device = device
        self.level = level
        self.prefetch = prefetch
        self.components: Dict[str, pins_nn.Streaming] = {}
        self._modules: Dict[str, Any] = {}  # name -> the module streamed (to see replacements)

    @property
    def models(self) -> List[int]:
        return sorted({s.model for s in self.components.values()})

    def stats(self) -> Dict[str, Dict[str, int]]:
        """Each component's :meth:`torch_pins.nn.Streaming.stats`."""
        return {name: s.stats() for name, s in self.components.items()}

    def sync(self, pipe: Any) -> None:
        """Streams the module components not streamed yet (all, the first time;
        then those replaced since) and releases those gone."""
        modules = {n: m for n, m in pipe.components.items() if isinstance(m, nn.Module)}
        for name in list(self._modules):
            if modules.get(name) is not self._modules[name]:
                self._release(name)
        for name, module in modules.items():
            if name not in self._modules:
                self._take(name, module)

    def _take(self, name: str, module: nn.Module) -> None:
        for t in list(module.parameters()) + list(module.buffers()):
            if t.device.type != "cpu":
                raise ValueError(f"enable: {self.name}.{name} has a tensor on {t.device}; pins streams weights "
                                 f"kept on the CPU: load the pipeline on the CPU (the default) or pipe.to('cpu')")
        s = pins_nn.streaming(module)
        if s is None:
            s = pins_nn.stream(module, self.device, name=f"{self.name}.{name}", level=self.level,
                               prefetch=self.prefetch)
            _users[module] = 0
        elif s.device != self.device:
            raise ValueError(f"enable: {self.name}.{name} is streamed to {s.device} already, not {self.device}")
        if module in _users:
            _users[module] += 1
        self.components[name] = s
        self._modules[name] = module

    def _release(self, name: str) -> None:
        module = self._modules.pop(name)
        self.components.pop(name, None)
        n = _users.get(module)
        if n is None:
            return  # streamed by the caller, not by enable()
        if n > 1:
            _users[module] = n - 1
        else:
            del _users[module]
            pins_nn.unstream(module)

    def release_all(self) -> None:
        for name in list(self._modules):
            self._release(name)


def _state(pipe: Any) -> StreamedPipeline:
    return pipe.__dict__[_STATE]


def _refuse(what: str):
    def refused(self, *args, **kwargs):
        raise RuntimeError(f"{what}: this {type(self).__name__}'s components are streamed by torch_pins; "
                           f"call torch_pins.diffusers.disable(pipe) first")
    refused.__name__ = what
    return refused


def _subclass_of(base: type) -> type:
    sub = _subclasses.get(base)
    if sub is not None:
        return sub

    def __call__(self, *args, **kwargs):
        state = _state(self)
        state.sync(self)
        opened = not stats()["prompt"]
        mark_prompt(state.models)
        try:
            return base.__call__(self, *args, **kwargs)
        finally:
            if opened:
                end_prompt()

    def _execution_device(self):
        return _state(self).device

    def to(self, *args, **kwargs):
        device = kwargs.get("device")
        for a in args:
            if a is not None and not isinstance(a, torch.dtype):
                device = a
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"to: this {type(self).__name__}'s components are streamed by torch_pins to "
                             f"{_state(self).device} and stay on the CPU; got device {device!r} "
                             f"(torch_pins.diffusers.disable(pipe) first)")
        return base.to(self, *args, **kwargs)

    members = {"__call__": __call__, "_execution_device": property(_execution_device), "to": to,
               "__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__}
    for name in ("enable_model_cpu_offload", "enable_sequential_cpu_offload", "enable_group_offload"):
        members[name] = _refuse(name)
    sub = _subclasses[base] = type(base.__name__, (base,), members)
    return sub


def _check_offload(pipe: Any) -> None:
    if getattr(pipe, "hf_device_map", None) is not None:
        raise ValueError(f"enable: {type(pipe).__name__} has a device_map ({pipe.hf_device_map!r}); "
                         f"call pipe.reset_device_map() first")
    for name, component in pipe.components.items():
        if not isinstance(component, nn.Module):
            continue
        for sub_name, m in component.named_modules():
            where = f"{name}.{sub_name}" if sub_name else name
            if getattr(m, "_hf_hook", None) is not None:
                raise ValueError(f"enable: {type(pipe).__name__}.{where} has accelerate's offload hook "
                                 f"({type(m._hf_hook).__name__}: enable_model_cpu_offload or "
                                 f"enable_sequential_cpu_offload); call pipe.remove_all_hooks() first")
            registry = getattr(m, "_diffusers_hook", None)
            if registry is not None and registry.get_hook("group_offloading") is not None:
                raise ValueError(f"enable: {type(pipe).__name__}.{where} has diffusers' group offloading; "
                                 f"pins does not stack on it: load the pipeline again without it")


def enable(pipe: Any, device: Union[torch.device, str, int, None] = None, *, level: str = "block",
           prefetch: Optional[int] = None) -> StreamedPipeline:
    """Streams ``pipe``'s module components to ``device`` through pins (Note
    [Streamed pipelines]); each call of the pipeline is a pins prompt.
    ``device``: by default the current CUDA device where there is one, else the
    CPU. ``level`` and ``prefetch`` are :func:`torch_pins.nn.stream`'s. Enabling
    again with the same device returns the same :class:`StreamedPipeline`.

    A ``pipe`` that is not a ``DiffusionPipeline``, one offloaded by diffusers
    or accelerate (``enable_model_cpu_offload``, ``enable_sequential_cpu_offload``,
    ``enable_group_offload``, a ``device_map``), a component with a tensor off
    the CPU, or a bad ``level``/``prefetch`` raises ``ValueError``."""
    if not isinstance(pipe, DiffusionPipeline):
        raise ValueError(f"enable: pipe must be a diffusers DiffusionPipeline, got {type(pipe).__name__}")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    state = pipe.__dict__.get(_STATE)
    if state is not None:
        if state.device != device:
            raise ValueError(f"enable: {type(pipe).__name__} is enabled for {state.device} already, not {device}; "
                             f"disable(pipe) first")
        return state
    if level not in pins_nn.LEVELS:
        raise ValueError(f"enable: level must be one of {', '.join(pins_nn.LEVELS)}, got {level!r}")
    _check_offload(pipe)
    base = type(pipe)
    state = StreamedPipeline(base, device, level, prefetch)
    try:
        state.sync(pipe)
    except BaseException:
        state.release_all()
        raise
    pipe.__dict__[_STATE] = state
    pipe.__class__ = _subclass_of(base)
    return state


def enabled(pipe: Any) -> Optional[StreamedPipeline]:
    """The :class:`StreamedPipeline` of ``pipe`` when :func:`enable` streams it, else None."""
    return getattr(pipe, "__dict__", {}).get(_STATE)


def disable(pipe: Any) -> None:
    """Undoes :func:`enable`: the pipeline's class comes back and its components
    are unstreamed (those another enabled pipeline shares stay streamed for it).
    A pipeline that is not enabled raises ``ValueError``."""
    state = enabled(pipe)
    if state is None:
        raise ValueError(f"disable: {type(pipe).__name__} is not enabled (torch_pins.diffusers.enable(pipe))")
    state.release_all()
    del pipe.__dict__[_STATE]
    pipe.__class__ = state.base
