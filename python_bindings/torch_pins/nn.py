"""Stream a ``torch.nn.Module``'s weights through pins: ``torch_pins.nn.stream(module, "cuda:0")``.

Note [Streamed modules]
~~~~~~~~~~~~~~~~~~~~~~~
:func:`stream` leaves every parameter and buffer where it is, on the CPU: those
tensors are the pins' sources (loaded any way, ``pins.load_file`` with
``load_state_dict(assign=True)`` included, whose pins are then filled from the
file). It splits the module into *units* and hooks each unit's *owner*
(``register_forward_pre_hook(prepend=True)``, ``register_forward_hook(
always_call=True)``):

- ``level="block"``: the elements of every ``ModuleList`` or ``Sequential``
  (a transformer's or a UNet's blocks, a ``Sequential`` of layers among them)
  and every other child that holds none, each one unit with all the tensors
  below it; a module that holds a container
  further down is split the same way, and its own tensors are a unit of their
  own, held for its whole forward (the root's too).
- ``level="leaf"``: every module with tensors of its own is a unit of those.

When a unit's owner starts its forward, the unit's CPU tensors go to the
device in one gathered transfer (``cast_many_to_device``, largest first, the
pins model of the module), and the device copies take their places in the
modules' ``_parameters`` and ``_buffers`` for that forward; when it ends (also
by an exception) the CPU tensors are put back and the copies released. A tensor
held by more than one unit (tied weights) is cast alone in each (one pin, hits
after the first); tensors already on the target device stay as they are
(``resident``). A copy written in place during the forward (a buffer updated
with ``add_``, ``copy_``) is copied back into its source when the unit ends,
where the version counter shows the write (``written_back``; under
``inference_mode`` no tensor has one). ``batch_norm`` updates running stats
without moving it, so a BatchNorm in training mode with running stats is
refused at the call. The casts follow the staleness contract of the cast path:
each call casts afresh, so an in-place write the version counter sees is
re-pinned by itself; a write it does not see (``.data``, an inference tensor)
needs ``pins.invalidate(tensor)``.

A call of the module (its root forward, or a unit's owner called alone) makes
its pins model active for the call (``set_active``: an active model counts as
in the prompt, for eviction); prompts are the caller's (``with pins.prompt([...])`` around one run of a workflow;
:mod:`torch_pins.diffusers` makes each pipeline call one). Casts issued ahead:
Note [Copies that overlap compute] (``_prefetch.py``).

torch.compile: the hooks are ``torch.compiler.disable``d (they keep state: the
previous call's order, casts in flight, counters), so a compiled module breaks
its graph at each unit's start and end and compiles what runs in between;
``fullgraph=True`` refuses that break. Regional compilation (compiling each
block, diffusers' ``compile_repeated_blocks``) compiles each block's forward.

Inference only: the device copies are plain tensors, so no gradient reaches the
parameters; a cast of a tensor that requires grad, with grad mode on, raises.
One forward at a time per streamed module (the swap is the module's state).
"""
import itertools
import threading
import weakref
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from . import _prefetch, _units
from . import forget_model, register_model, set_active
from ._units import LEVELS

__all__ = ["stream", "unstream", "streaming", "Streaming", "LEVELS"]

# Every module below a streamed root, to its Streaming: a module is streamed once.
_claimed: "weakref.WeakKeyDictionary[nn.Module, Streaming]" = weakref.WeakKeyDictionary()
_roots: "weakref.WeakKeyDictionary[nn.Module, Streaming]" = weakref.WeakKeyDictionary()


class Streaming:
    """What :func:`stream` did to a module: ``device``, ``model`` (the pins
    model id), ``level``, ``prefetch``, ``units`` (their names), and counters
    in :meth:`stats`. :meth:`remove` is :func:`unstream`."""

    def __init__(self, module: nn.Module, device: torch.device, model: int, owns_model: bool, level: str,
                 prefetch: int, streams: _prefetch.Streams):
        self.device = device
        self.model = model
        self.level = level
        self.prefetch = prefetch
        self._module = weakref.ref(module)
        self._owns_model = owns_model
        self._forget = weakref.finalize(module, forget_model, model) if owns_model else None
        self._counts = {k: 0 for k in ("calls", "unit_casts", "gathered", "single", "resident", "written_back",
                                       "prefetched", "prefetch_used", "prefetch_unused", "prefetch_stale",
                                       "prefetch_failed")}
        self._prefetcher = _prefetch.Prefetcher(streams, prefetch, self._counts)
        self._units: List[_units.Unit] = []
        self._root_hooks: List[Any] = []
        self._shared: set = set()
        self._depth = 0
        self._thread: Optional[int] = None
        self._removed = False
        self._batch_norms = [(n, weakref.ref(m)) for n, m in module.named_modules()
                             if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    @property
    def units(self) -> List[str]:
        return [u.name for u in self._units]

    def stats(self) -> Dict[str, int]:
        """``calls`` of the module, ``unit_casts`` (units cast: gathered ``gathered``
        and tensors cast alone ``single``), ``resident`` (tensors already on the
        device, used in place), ``written_back``, and the prefetch's
        ``prefetched``, ``prefetch_used``, ``prefetch_unused``, ``prefetch_stale``,
        ``prefetch_failed`` (Note [Copies that overlap compute])."""
        return dict(self._counts)

    def remove(self) -> None:
        """Takes the hooks out; the module is as before :func:`stream`. The pins
        model is forgotten (its pins freed) when :func:`stream` registered it."""
        if self._removed:
            return
        if self._depth:
            raise RuntimeError(f"unstream: {self._name()} is running a forward; unstream it after the call")
        for h in [h for u in self._units for h in u.hooks] + self._root_hooks:
            h.remove()
        for u in self._units:
            u.hooks.clear()
        self._root_hooks.clear()
        module = self._module()
        if module is not None:
            _roots.pop(module, None)
            for m in module.modules():
                if _claimed.get(m) is self:
                    del _claimed[m]
        if self._forget is not None:
            self._forget()
        self._removed = True

    def __repr__(self) -> str:
        return (f"Streaming({self._name()} to {self.device}, model {self.model}, level {self.level!r}, "
                f"{len(self._units)} units, prefetch {self.prefetch})")

    def _name(self) -> str:
        module = self._module()
        return type(module).__name__ if module is not None else "a collected module"

    # ---- the hooks (Note [Streamed modules])

    def _begin(self) -> None:
        thread = threading.get_ident()
        if self._depth:
            if thread != self._thread:
                raise RuntimeError(f"torch_pins.nn: {self._name()} is streamed and already running a forward in "
                                   f"another thread; one forward at a time")
            self._depth += 1
            return
        for name, ref in self._batch_norms:
            m = ref()
            if m is not None and m.training and m.track_running_stats:
                raise RuntimeError(f"torch_pins.nn: {type(m).__name__} {name!r} is in training mode: batch_norm "
                                   f"updates its running stats on the device copy, unseen by any version counter, "
                                   f"so the update would be lost; call .eval() on it first")
        self._thread = thread
        self._depth = 1
        self._counts["calls"] += 1
        self._prefetcher.begin()
        set_active(self.model, True)

    def _end(self) -> None:
        if self._depth == 0 or threading.get_ident() != self._thread:
            return  # the call did not begin (another thread's call runs)
        self._depth -= 1
        if self._depth == 0:
            self._prefetcher.end()
            self._thread = None
            set_active(self.model, False)

    def _enter(self, unit: _units.Unit) -> None:
        self._begin()  # a call of its own where the root's did not begin one (a submodule called alone)
        unit.depth += 1
        if unit.depth > 1:
            return  # re-entered: its copies are in place
        copies = self._prefetcher.take(unit, self._cast)
        unit.copies = copies
        saved = unit.saved
        for result, places in zip(copies.results, copies.places):
            for d, key in places:
                saved.append((d, key, d[key]))
                d[key] = result

    def _leave(self, unit: _units.Unit) -> None:
        if unit.depth == 0 or threading.get_ident() != self._thread:
            return  # its pre-hook did not run (an earlier hook raised, another thread's call)
        unit.depth -= 1
        if unit.depth == 0:
            for d, key, original in reversed(unit.saved):
                d[key] = original
            unit.saved.clear()
            copies, unit.copies = unit.copies, None
            if copies is not None:
                self._write_back(copies)
        self._end()

    def _write_back(self, copies: _units.Copies) -> None:
        for source, result, version in zip(copies.sources, copies.results, copies.written):
            if version is not None and result._version != version and not source.is_inference():
                with torch.no_grad():
                    source.copy_(result)
                self._counts["written_back"] += 1

    def _cast(self, unit: _units.Unit) -> _units.Copies:
        return _units.cast(unit, self.device, self.model, self._shared, self._counts)

    def _hook(self, module: nn.Module, unit: Optional[_units.Unit]) -> None:
        if unit is not None:
            unit.hooks.append(module.register_forward_pre_hook(_disabled(lambda m, a: self._enter(unit)),
                                                               prepend=True))
            unit.hooks.append(module.register_forward_hook(_disabled(lambda m, a, o: self._leave(unit)),
                                                           always_call=True))

    def _hook_root(self, module: nn.Module) -> None:
        # After the root's own unit, prepended: the call begins before any cast
        # on the root and ends after every release.
        self._root_hooks.append(module.register_forward_pre_hook(_disabled(lambda m, a: self._begin()),
                                                                 prepend=True))
        self._root_hooks.append(module.register_forward_hook(_disabled(lambda m, a, o: self._end()),
                                                             always_call=True))


def _disabled(fn: Any) -> Any:
    return torch.compiler.disable(fn, recursive=True)


def _check_free(module: nn.Module) -> None:
    for name, m in module.named_modules():
        if m in _claimed:
            where = f"its submodule {name!r}" if name else "it"
            raise ValueError(f"stream: {type(module).__name__} is already streamed ({where}: {_claimed[m]!r}); "
                             f"unstream it first")
        hook = getattr(m, "_hf_hook", None)
        if hook is not None:
            raise ValueError(f"stream: {type(module).__name__} has accelerate's hook {type(hook).__name__} on "
                             f"{name or 'itself'} (an offload mode: enable_model_cpu_offload, "
                             f"enable_sequential_cpu_offload, a device_map); remove it first")
        registry = getattr(m, "_diffusers_hook", None)
        if registry is not None and getattr(registry, "get_hook", lambda n: None)("group_offloading") is not None:
            raise ValueError(f"stream: {type(module).__name__} has diffusers' group offloading on "
                             f"{name or 'itself'}; remove it first")


def stream(module: nn.Module, device: Union[torch.device, str, int], *, model: Optional[int] = None,
           name: Optional[str] = None, level: str = "block", prefetch: Optional[int] = None) -> Streaming:
    """Makes ``module`` stream its parameters and buffers from the CPU to
    ``device`` through pins, one unit at a time (Note [Streamed modules]):
    ``level="block"`` (blocks of its ``ModuleList``/``Sequential`` containers)
    or ``"leaf"`` (every module with tensors). ``model``: the pins model id to
    cast with; by default one is registered, named ``name`` or the module's
    class, with the bytes of its CPU tensors as its size, and forgotten with
    the module or by :func:`unstream`. ``prefetch``: how many units ahead are
    cast on a side stream while a unit runs (Note [Copies that overlap
    compute]); default 1 on a CUDA device, 0 elsewhere. Returns the
    :class:`Streaming`.

    A ``module`` that is not a ``torch.nn.Module``, a bad ``level`` or
    ``prefetch``, a module (or a submodule) already streamed or offloaded by
    accelerate's or diffusers' hooks raise ``ValueError``."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"stream: module must be a torch.nn.Module, got {type(module).__name__}")
    if level not in LEVELS:
        raise ValueError(f"stream: level must be one of {', '.join(LEVELS)}, got {level!r}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    depth = _prefetch.check_depth(prefetch, device)
    if model is not None and (isinstance(model, bool) or not isinstance(model, int) or model < 0):
        raise ValueError(f"stream: model must be None or a registered model id, got {type(model).__name__} {model!r}")
    _check_free(module)
    split = _units.split(module, level)
    owns = model is None
    if owns:
        tensors = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
        size = sum(t.nbytes for t in tensors.values() if t.device.type == "cpu")
        model = register_model(name or type(module).__name__, device, size=size)
    s = Streaming(module, device, model, owns, level, depth, _prefetch.streams_for(device))
    s._units = [_units.Unit(unit_name, [slot for m in modules for slot in _units.own_slots(m)])
                for unit_name, _, modules in split]
    s._shared = _units.shared_tensors(s._units)  # tied weights: cast alone in each unit
    for unit, (_, owner, _) in zip(s._units, split):
        s._hook(owner, unit)
    s._hook_root(module)
    for m in module.modules():
        _claimed[m] = s
    _roots[module] = s
    return s


def streaming(module: nn.Module) -> Optional[Streaming]:
    """The :class:`Streaming` of ``module`` when :func:`stream` streams it, else None."""
    return _roots.get(module)


def unstream(module: nn.Module) -> None:
    """Undoes :func:`stream`: the hooks come out and the module's parameters and
    buffers are the objects they were (they never left). A module that is not
    streamed, or one running a forward, raises ``ValueError``/``RuntimeError``."""
    s = _roots.get(module) if isinstance(module, nn.Module) else None
    if s is None:
        raise ValueError(f"unstream: {type(module).__name__} is not streamed (stream() returns what unstream undoes)")
    s.remove()
