"""pins: a pinned host-RAM cache for model weights, and the cast that uses it.

Load the library and use the ops::

    import torch_pins as pins
    unet = pins.register_model("unet", "cuda:0")
    with pins.prompt([unet]):
        w = pins.cast_to_device(weight, "cuda:0", model=unet, non_blocking=True)
        w, b = pins.cast_many_to_device([layer.weight, layer.bias], "cuda:0", model=unet)
        pins.end_node()
    print(pins.summary())

A ``torch.nn.Module`` streams its weights through pins in one call,
``pins.stream(module, "cuda:0")`` (:mod:`torch_pins.nn`); a diffusers pipeline
with ``pins.diffusers.enable(pipe)`` (:mod:`torch_pins.diffusers`).

Every function here calls the torch op of the same name (``torch.ops.pins.*``),
so Python, TorchScript and C++ run the same code; :func:`cast_to_device` calls it
through the package's extension module where the build made one, which skips
the generic Python call of an op (Note [Python fast path]). Configuration comes
from the ``PINS_CONF`` environment variable or :func:`configure`.

Staleness: a pin is valid for its source's storage (held weakly), byte offset,
size, layout, version counter where the source has one (inference tensors have
none and are pinned all the same) and the caller's ``signature``. A write that
the version counter does not see (through ``.data``, a numpy alias, ``set_()``,
``untyped_storage().copy_()``, any in-place write to an inference tensor, a file
rewritten under its mmap) is the caller's to report: :func:`invalidate`,
:func:`invalidate_model`, or a new ``signature``. With the ``content_check`` key
on (off by default, for its cost), a hit also compares four 32-byte windows of
the source with the pin and pins again when one differs
(``stats()["content_mismatches"]``): a whole-tensor write is caught, a sparse
one or one to a file mapping's pages is not.

Errors: a bad value of an argument or of the configuration (a source that is not
a dense, non-quantized CPU tensor, an unknown ``kind``, a negative byte count, a
model id that is not registered, an unknown key or bad value in ``PINS_CONF``)
raises ``ValueError``; a request that cannot be served in the current state
(``/proc/meminfo`` unreadable, a monitor thread that cannot start) raises
``RuntimeError``. Both say what was wrong and the value it got.
"""
import contextlib
import functools
import os
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Union

import torch

from . import _library
from ._version import __version__

# The extension after the library: it finds the op in the dispatcher.
_C = _library.load_extension(_library.load())
from . import _fake  # noqa: E402,F401  (registers the fake kernels)
from . import _subclass  # noqa: E402  (tensor wrapper subclasses: Note [Wrapper subclasses])
from . import _report  # noqa: E402  (Note [Prompt history])

__all__ = [
    "register_model", "forget_model", "set_active", "set_device_bytes", "mark_prompt", "end_prompt", "end_node",
    "prompt",
    "cast_to_device", "cast_many_to_device", "invalidate", "invalidate_model", "free_pins", "load_file", "stats",
    "Stats",
    "summary", "locked_bytes", "configure", "config", "config_sources", "report", "library_path", "__version__",
    "stream", "unstream",
]

# Imported on first use (PEP 562): torch_pins.nn streams a torch.nn.Module
# (pins.stream, pins.unstream); torch_pins.diffusers needs diffusers, an
# optional dependency, and says so when it is missing.
_LAZY_MODULES = ("nn", "diffusers")
_LAZY_NAMES = {"stream": "nn", "unstream": "nn"}


def __getattr__(name: str):
    import importlib
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

library_path = _library.library_path
_ops = torch.ops.pins
# The overload itself: calling the packet (torch.ops.pins.cast_to_device) first
# resolves among its overloads on every call.
_cast_to_device_op = _ops.cast_to_device.default
# What cast_to_device calls: the extension's entry, which skips the generic op
# call, where it loaded (Note [Python fast path], python_bindings/csrc/module.cpp).
_cast_to_device = _C.cast_to_device if _C is not None else _cast_to_device_op
# Dynamo cannot trace a C function (a graph break): while it traces, the op.
# is_dynamo_compiling, not is_compiling: other tracers (make_fx, non-strict
# export) reach the op through the extension's forwarding or the dispatcher.
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling
_PLAIN_TYPES = _subclass._PLAIN_TYPES
DeviceLike = Union[torch.device, str, int]
_history = _report.PromptHistory(lambda: _ops.stats())


def _host(fn):
    """Note [Host calls under torch.compile]
    The ops that keep pins' books (models, prompts, invalidation, freeing,
    loading, counters, settings) take no tensor or give none that a graph
    computes with. Dynamo would put them in its graph and AOTAutograd, which
    records only what tensors flow through, would run them once while tracing
    and leave them out of the compiled code: a compiled function would mark no
    prompt and end no node after its first call. So while Dynamo traces, each
    runs through ``torch.compiler.disable``: outside every graph, at every
    call, where the program calls it. Eager calls go straight to the op (no
    import of torch._dynamo for programs that never compile). The casts are
    tensor ops and are traced."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not _is_dynamo_compiling():
            return fn(*args, **kwargs)
        return torch.compiler.disable(fn, reason="pins' bookkeeping runs where it is called")(*args, **kwargs)
    return call


def _check_signature(op: str, signature: Optional[int]) -> None:
    # The op takes an int64 or None; a clear error here rather than the
    # overload resolver's RuntimeError.
    if signature is None:
        return
    if isinstance(signature, bool) or not isinstance(signature, int) or not -(1 << 63) <= signature < (1 << 63):
        raise ValueError(f"{op}: signature must be None or an int64, got {type(signature).__name__} {signature!r}")


def _check_byte_count(op: str, name: str, value: int) -> None:
    # An int64 >= 0 (a bool is no count); a clear error naming the argument.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << 63):
        raise ValueError(f"{op}: {name} must be a byte count (an int >= 0), got {type(value).__name__} {value!r}")


@_host
def register_model(name: str, load_device: DeviceLike, fast_disk: bool = False, size: int = 0) -> int:
    """Registers a model (weights that load and unload together) and returns its id.

    ``load_device`` is the device its weights are cast to. ``fast_disk``: its
    weights reload fast from disk, so the model gets no ``-loaded`` pins (the
    ``fast_disk`` configuration key, for this model only). ``size``: the bytes
    of its weights when known (0: unknown), what its first prompt is expected
    to pin: the prewarm commits that much pool memory ahead of the prompt's
    casts, within the budget (the ``prewarm`` key; DESIGN.md "Prewarm"). A
    model registered later counts as loaded more recently (see the eviction
    order in DESIGN.md). Names may repeat: :func:`stats` keys a repeated name
    ``<name>#<id>``."""
    if not isinstance(fast_disk, bool):
        raise ValueError(f"register_model: fast_disk must be a bool, got {type(fast_disk).__name__} {fast_disk!r}")
    _check_byte_count("register_model", "size", size)
    return _ops.register_model(name, torch.device(load_device), fast_disk, size)


@_host
def forget_model(model: int) -> None:
    """Forgets a model and frees all its pins."""
    _ops.forget_model(model)


@_host
def set_active(model: int, active: bool = True) -> None:
    """Marks a model as executing now (its streaming pins are then evicted last).
    Becoming active counts as being loaded again."""
    _ops.set_active(model, active)


@_host
def set_device_bytes(model: int, nbytes: int, total: int) -> None:
    """Says that ``nbytes`` of the model's ``total`` bytes of weights are on its
    device now, after a load or an unload pins does not see (ComfyUI's
    integration calls it with ``ModelPatcher.loaded_size()`` and
    ``model_size()``). The trace policy then lets a new workflow's first load
    take the pins of this model's layers that stay on the device (Note [Spared
    layers on the device] in csrc/balancer/pin_table.h). More than ``total``
    counts as ``total``."""
    _check_byte_count("set_device_bytes", "nbytes", nbytes)
    _check_byte_count("set_device_bytes", "total", total)
    _ops.set_device_bytes(model, nbytes, total)


@_host
def mark_prompt(models: Iterable[int]) -> None:
    """Marks models as used by the current prompt, starting a prompt if none runs."""
    _ops.mark_prompt(list(models))


@_host
def end_prompt() -> None:
    """The prompt boundary: clears the marks and drops the ``patches`` pins;
    records what the prompt moved (:func:`report`, Note [Prompt history])."""
    _ops.end_prompt()
    _history.record()


@_host
def end_node() -> None:
    """A node boundary inside a prompt (ComfyUI ends one after every node): drops
    the ``patches`` pins, clears ``active`` on every model, drops pins of sources
    that died and runs the RAM-pressure check. The prompt goes on."""
    _ops.end_node()


@contextlib.contextmanager
def prompt(models: Iterable[int] = ()) -> Iterator[None]:
    """``with pins.prompt([unet, vae]):`` marks the models for the block and ends
    the prompt when it exits, also on an exception."""
    mark_prompt(models)
    try:
        yield
    finally:
        end_prompt()


def cast_to_device(source: torch.Tensor, device: DeviceLike, dtype: Optional[torch.dtype] = None,
                   non_blocking: bool = False, model: int = -1, kind: str = "weights",
                   resident: bool = False, signature: Optional[int] = None,
                   out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Copies a CPU ``source`` to ``device`` (converted to ``dtype`` if given) through
    its pin.

    ``model=-1`` is a plain copy. Otherwise the source is served from its pin, or
    a pin is created within the RAM budget: in the ``-loaded`` cache subset when
    ``resident`` (the copy stays on the device; for ``kind="patches"`` also a
    ``signature`` is needed) and fast-disk is off, else in the streaming subset.
    When no pin serves the cast (the budget refused one, ...) the copy comes
    straight from the source, counted in ``stats()["bypassed.<reason>"]``.
    ``kind`` is ``"weights"`` or ``"patches"`` (patch tensors such as LoRA
    factors). ``signature`` is the patch set of patches, and a content signature
    of weights: a pin made under another signature (or none) is stale and made
    again. A source written in place through its version counter, or freed, is
    re-pinned; other writes need :func:`invalidate` (see the module's
    docstring). Non-contiguous sources are pinned as a contiguous copy.

    ``out``: write the result into this tensor instead (on ``device``, of the
    source's shape, of dtype ``dtype`` or else the source's) on the current
    stream, and return it. Tensor wrapper subclasses (a quantized weight) are
    cast through their inner tensors (``torch_pins._subclass``).

    A source that is not a dense, non-quantized CPU tensor, a bad ``kind``, a
    ``model`` that is not registered or an ``out`` that does not fit raises
    ``ValueError``."""
    # The hot path (docs/PERFORMANCE.md, "cast from Python"): a plain tensor, a
    # torch.device, no signature and no out= cost four checks and one call of
    # the extension's entry (Note [Python fast path]) or else the op's overload.
    if signature is not None:
        _check_signature("cast_to_device", signature)
    if type(source) not in _PLAIN_TYPES:
        if _subclass.is_wrapper(source):
            return _subclass.cast_to_device(source, device, dtype, non_blocking, model, kind, resident, signature, out)
        if out is None and isinstance(source, torch.Tensor):  # Note [Plain subclasses]
            given = _subclass.op_source(source)
            if type(device) is not torch.device:
                device = torch.device(device)
            cast = _cast_to_device_op if _is_dynamo_compiling() else _cast_to_device
            return _subclass.rebuild(source, cast(given, device, dtype, non_blocking, model, kind, resident, signature))
    if type(device) is not torch.device:
        device = torch.device(device)
    if out is None:
        cast = _cast_to_device_op if _is_dynamo_compiling() else _cast_to_device
        # torch.ops parses every argument it is given against the schema (about
        # 0.4 us each from Python): trailing defaults are left to the schema.
        if signature is None and resident is False and kind == "weights":
            return cast(source, device, dtype, non_blocking, model)
        return cast(source, device, dtype, non_blocking, model, kind, resident, signature)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"cast_to_device: out must be a tensor, got {type(out).__name__}")
    return _ops.cast_to_device.out(source, device, dtype, non_blocking, model, kind, resident, signature, out=out)


def cast_many_to_device(sources: Sequence[torch.Tensor], device: DeviceLike, dtype: Optional[torch.dtype] = None,
                        non_blocking: bool = False, model: int = -1, kind: str = "weights",
                        resident: bool = False, signature: Optional[int] = None) -> List[torch.Tensor]:
    """:func:`cast_to_device` for several sources (a module's weight and bias) at
    once: one pin holds them all (their dtypes may differ) and one transfer
    brings it to ``device``. Returns the results in order, each converted to
    ``dtype`` when given. No two results share a storage (torch's rule for custom
    ops, which ``torch.compile`` checks): the first stays a view of the
    transfer's buffer when it needs no conversion, the others are copied out of
    it on the device, so pass the largest source (the weight) first. The same group of sources
    hits the same pin; a stale or invalidated part makes the whole group stale.
    ``model``, ``kind``, ``resident`` and ``signature`` apply to the group.

    ``sources`` is a list or tuple of tensors; ``None`` entries are not allowed
    (``ValueError`` naming the entry), nor anything :func:`cast_to_device`
    refuses. Wrapper subclasses among them are taken apart
    (``torch_pins._subclass``)."""
    if isinstance(sources, torch.Tensor) or not isinstance(sources, (list, tuple)):
        raise ValueError(f"cast_many_to_device: sources must be a list or tuple of tensors, got "
                         f"{type(sources).__name__}")
    _check_signature("cast_many_to_device", signature)
    sources = list(sources)
    for i, s in enumerate(sources):
        if s is None:
            raise ValueError(f"cast_many_to_device: sources[{i}] is None; None is not allowed in sources")
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"cast_many_to_device: sources[{i}] must be a tensor, got {type(s).__name__}")
    if any(_subclass.is_wrapper(s) for s in sources):
        return _subclass.cast_many_to_device(sources, device, dtype, non_blocking, model, kind, resident, signature)
    subclassed = [_subclass.is_plain_subclass(s) for s in sources]  # Note [Plain subclasses]
    casts = list(_ops.cast_many_to_device([_subclass.op_source(s) if sub else s for s, sub in zip(sources, subclassed)],
                                          torch.device(device), dtype, non_blocking, model, kind, resident, signature))
    return [_subclass.rebuild(s, c) if sub else c for s, c, sub in zip(sources, casts, subclassed)]


@_host
def invalidate(source: torch.Tensor) -> int:
    """Drops every pin (any model, any subset, gathered pins included) whose
    source bytes overlap ``source``'s bytes in its storage; returns the bytes
    dropped. Call it after writing ``source`` where its version counter does not
    see it (``.data``, numpy aliases, ``set_()``, ``untyped_storage().copy_()``,
    an inference tensor written in place). A pin being read by a cast in flight is
    detached and freed when that cast is done, never served again. A wrapper
    subclass is invalidated through its inner CPU tensors; any other source that
    is not a dense, non-quantized CPU tensor raises ``ValueError``."""
    if _subclass.is_wrapper(source):
        return sum(int(_ops.invalidate(t)) for t in _subclass.inner_tensors(source) if t.device.type == "cpu")
    return _ops.invalidate(source)


@_host
def load_file(path: Union[str, "os.PathLike[str]"]) -> Dict[str, torch.Tensor]:
    """The tensors of the safetensors file at ``path``, by name, in the order of
    their bytes in the file: CPU tensors over a private (copy-on-write) mapping
    of the file, as a loader gives them to an application; writing to them
    never changes the file. pins knows where each one lives in the file: a new
    pin of one is filled from the file (O_DIRECT where the filesystem allows it)
    rather than through the mapping, so the weight is not held a second time in
    the page cache; once a tensor is written in place, its pin is filled from
    memory instead (``stats()["file_fills_written"]``); a rewrite of the file in
    place is seen on a hit and the pin made again (``stats()["file_changes"]``).
    A malformed file raises ``ValueError`` naming the file and the field (what
    safetensors' own reader refuses, pins refuses); anything but a regular file
    or a path with a NUL byte, ``ValueError`` before it is read; one that
    cannot be opened, ``RuntimeError`` naming the path."""
    return dict(_ops.load_file(os.fspath(path)))


@_host
def invalidate_model(model: int) -> int:
    """Drops every pin of ``model`` (which stays registered); returns the bytes
    dropped. A ``model`` that is not registered raises ``ValueError``."""
    return _ops.invalidate_model(model)


@_host
def free_pins(bytes: int, evict_active: bool = False, loaded: bool = False) -> int:
    """Frees at least ``bytes`` of pins along the eviction tiers (active models'
    streaming pins only with ``evict_active``; with ``loaded``, only the tiers a
    new cache pin may take: no streaming pin of a model in the prompt, as
    ComfyUI's ``free_pins(loaded=True)``); returns the bytes of pins freed.
    Short of pins to evict, the pool's idle committed memory goes back too, up
    to ``bytes``. A negative ``bytes`` raises ``ValueError``."""
    return _ops.free_pins(bytes, evict_active, loaded)


class Stats(dict):
    """The counters of :func:`stats`: a dict that prints as a table."""

    def __str__(self) -> str:
        width = max((len(k) for k in self), default=0)

        def fmt(key, value):
            if key.endswith("bytes") and abs(value) >= 1 << 30:
                return f"{value:>16,d}  ({value / (1 << 30):.2f} GiB)"
            if key.endswith("bytes") and abs(value) >= 1 << 20:
                return f"{value:>16,d}  ({value / (1 << 20):.1f} MiB)"
            return f"{value:>16,d}"

        return "\n".join(f"{k:<{width}}  {fmt(k, v)}" for k, v in sorted(self.items()))


@_host
def stats() -> Stats:
    """Every counter: pins, pinned and committed bytes, hits and misses, evictions
    by tier, refusals, casts served from the source by reason
    (``bypassed.<reason>``: ``empty``, ``refused``, ``pool``, ``busy``,
    ``raced``, ``forgotten``, ``unlocking``; ``bypassed`` their sum), ``plain_copies``
    (``model=-1``), per subset (``weights.bytes``...) and per model, by id and by
    name (``model.<id>.*`` and ``model.<name>.*``; a name registered more than
    once reads ``<name>#<id>`` for all but the lowest id, a name made only of
    digits always does)."""
    return Stats(_ops.stats())


@_host
def locked_bytes() -> int:
    """The bytes pins holds page-locked now: ``stats()["locked_bytes"]`` without
    building every counter, for a check made before each page-lock of one's own
    (ComfyUI's cap on pinned memory, which :mod:`torch_pins.comfy` counts pins'
    bytes into)."""
    return int(_ops.locked_bytes())


@_host
def summary() -> str:
    """A few lines for people: pins and bytes per subset, hits, misses and hit
    rate, casts bypassed by reason, plain copies, what was freed, one line per
    model."""
    return _ops.summary()


@_host
def configure(conf: str = "", **keys) -> None:
    """Applies settings, in PINS_CONF syntax and/or as keywords:
    ``pins.configure("policy:trace", headroom="6G")``.

    An unknown key, a bad value, or a key of the host pool once the pool exists
    raises ``ValueError`` and applies nothing; a monitor that cannot start raises
    ``RuntimeError`` after the rest was applied."""
    parts = [conf] if conf else []
    for k, v in keys.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        parts.append(f"{k}:{v}")
    _ops.configure(",".join(parts))


@_host
def report() -> Dict[str, object]:
    """Everything ``python -m torch_pins stats --json`` prints, as a dict: the
    version, library, torch, configuration (``{key: {"value", "source"}}``),
    backend and ``counters`` (:func:`stats`); ``models`` (each model's pins and
    bytes per subset), ``budget`` (pinned bytes against what the budget lets pins
    hold now) and ``prompts`` (what each of the last 32 prompts moved, and the
    current one: Note [Prompt history] in ``_report.py``)."""
    return _report.report(_history)


@_host
def config() -> Dict[str, str]:
    """The settings in force (PINS_CONF, then :func:`configure`), every key with
    its value as PINS_CONF writes it (sizes in bytes):
    ``pins.config()["policy"] == "mru"``."""
    return dict(part.split(":", 1) for part in _ops.config().split(",") if part)


@_host
def config_sources() -> Dict[str, str]:
    """Where each setting of :func:`config` came from, every key: ``"default"``,
    ``"derived from the machine: RAM 23.54 GiB"`` (or ``cgroup limit``; for
    ``headroom`` and ``pin_reserve``, which scale with the machine unless set),
    ``"PINS_CONF"`` or ``"configure()"``."""
    return dict(part.split(":", 1) for part in _ops.config_sources().split(",") if part)
