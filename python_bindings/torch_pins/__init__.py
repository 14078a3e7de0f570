"""pins: a pinned host-RAM cache for model weights, and the cast that uses it.

Load the library and use the ops::

    import torch_pins as pins
    unet = pins.register_model("unet", "cuda:0")
    with pins.prompt([unet]):
        w = pins.cast_to_device(weight, "cuda:0", model=unet, non_blocking=True)
    print(pins.stats())

Every function here calls the torch op of the same name (``torch.ops.pins.*``),
so Python, TorchScript and C++ run the same code. Configuration comes from the
``PINS_CONF`` environment variable or :func:`configure`.

Errors: a bad value of an argument or of the configuration (a source that is not
a dense, non-quantized CPU tensor, an unknown ``kind``, a negative byte count, a
model id that is not registered, an unknown key or bad value in ``PINS_CONF``)
raises ``ValueError``; a request that cannot be served in the current state
(``/proc/meminfo`` unreadable, a monitor thread that cannot start) raises
``RuntimeError``. Both say what was wrong and the value it got.
"""
import contextlib
from typing import Dict, Iterable, Iterator, Optional, Union

import torch

from . import _library
from ._version import __version__

_library.load()
from . import _fake  # noqa: E402,F401  (registers the fake kernels)

__all__ = [
    "register_model", "forget_model", "set_active", "mark_prompt", "end_prompt", "prompt",
    "cast_to_device", "free_pins", "stats", "Stats", "configure", "library_path", "__version__",
]

library_path = _library.library_path
_ops = torch.ops.pins
DeviceLike = Union[torch.device, str, int]


def register_model(name: str, load_device: DeviceLike) -> int:
    """Registers a model (weights that load and unload together) and returns its id.

    ``load_device`` is the device its weights are cast to. A model registered
    later counts as loaded more recently (see the eviction order in DESIGN.md)."""
    return _ops.register_model(name, torch.device(load_device))


def forget_model(model: int) -> None:
    """Forgets a model and frees all its pins."""
    _ops.forget_model(model)


def set_active(model: int, active: bool = True) -> None:
    """Marks a model as executing now (its streaming pins are then evicted last).
    Becoming active counts as being loaded again."""
    _ops.set_active(model, active)


def mark_prompt(models: Iterable[int]) -> None:
    """Marks models as used by the current prompt, starting a prompt if none runs."""
    _ops.mark_prompt(list(models))


def end_prompt() -> None:
    """The prompt boundary: clears the marks and drops the ``patches`` pins."""
    _ops.end_prompt()


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
                   resident: bool = False, signature: Optional[int] = None) -> torch.Tensor:
    """Copies a CPU ``source`` to ``device`` (converted to ``dtype`` if given) through
    its pin.

    ``model=-1`` is a plain copy. Otherwise the source is served from its pin, or
    a pin is created within the RAM budget: in the ``-loaded`` cache subset when
    ``resident`` (the copy stays on the device; for ``kind="patches"`` also a
    ``signature`` is needed) and fast-disk is off, else in the streaming subset.
    When the budget refuses a pin the copy comes straight from the source.
    ``kind`` is ``"weights"`` or ``"patches"`` (patch tensors such as LoRA
    factors). A pin never serves stale data: a source written in place or freed
    is re-pinned. Non-contiguous sources are pinned as a contiguous copy.

    A source that is not a dense, non-quantized CPU tensor, a bad ``kind``, a
    ``signature`` without ``kind="patches"`` or a ``model`` that is not
    registered raises ``ValueError``."""
    return _ops.cast_to_device(source, torch.device(device), dtype, non_blocking, model, kind, resident, signature)


def free_pins(bytes: int, evict_active: bool = False) -> int:
    """Frees at least ``bytes`` of pins along the eviction tiers (active models'
    streaming pins only with ``evict_active``); returns the bytes freed. A
    negative ``bytes`` raises ``ValueError``."""
    return _ops.free_pins(bytes, evict_active)


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


def stats() -> Stats:
    """Every counter: pins, pinned and committed bytes, hits and misses, evictions
    by tier, refusals, per subset (``weights.bytes``...) and per model
    (``model.<id>.*``)."""
    return Stats(_ops.stats())


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
