"""ComfyUI's models as pins models: ``ModelPatcher.__init__`` (clones run it
too) registers a pins model for the patcher's ``model`` (the
``torch.nn.Module`` that holds the weights; clones share it, so they share the
pins model), named after the module's class (``SDXL``, ``AutoencoderKL``), with
the patcher's ``load_device`` and ``model_size()`` (what pins' prewarm commits
ahead of the model's first prompt; DESIGN.md "Prewarm"). It is forgotten when
that module is garbage collected (``weakref.finalize``), not when one clone
dies."""
import functools
import logging
import weakref
from typing import Any, List, Optional

import torch

import torch_pins as pins

from .. import _subclass
from .state import Integration, ModelEntry, count, current, log_once


def _forget(key: int, pins_id: int) -> None:
    state = current()
    if state is None:
        return
    with state.lock:
        state.entries.pop(key, None)
    try:
        pins.forget_model(pins_id)
    except Exception as e:  # during interpreter shutdown the library may be gone
        log_once(logging.DEBUG, f"pins: forget_model({pins_id}) failed: {e}")


def register(state: Integration, patcher: Any) -> Optional[ModelEntry]:
    """The pins model of the patcher's weight module, registered on first sight."""
    module = getattr(patcher, "model", None)
    if not isinstance(module, torch.nn.Module):
        return None
    with state.lock:
        entry = state.entries.get(id(module))
        if entry is not None and entry.module() is module:
            return entry
        device = getattr(patcher, "load_device", None)
        if device is None:
            return None
        name = type(module).__name__  # pins.stats() keys a repeated name <name>#<id>
        try:
            pins_id = pins.register_model(name, device, fast_disk=state.options["fast_disk"],
                                          size=_model_size(patcher))
        except Exception as e:
            count("errors")
            log_once(logging.WARNING, f"pins: cannot register {name} on {device}: {e}")
            return None
        entry = ModelEntry(pins_id, name, module)
        entry.finalizer = weakref.finalize(module, _forget, id(module), pins_id)
        entry.finalizer.atexit = False
        state.entries[id(module)] = entry
        map_modules(state, module, entry)
        return entry


def _model_size(patcher: Any) -> int:
    """The bytes of the patcher's weights, which size pins' prewarm before the
    model's first prompt: ComfyUI's own ``ModelPatcher.size`` where it has
    computed it, else counted here from the module's parameters and
    persistent buffers (the inner tensors of a wrapper subclass). Never
    ``model_size()``: ComfyUI keeps what that computes, and 0.33 makes a
    diffusion model's patcher before it loads the weights, so it would keep
    the empty model's size (and its quantized ops log a warning each when
    their state_dict is asked for before then). pins changes nothing ComfyUI
    computes about its models; the prewarm of such a model's first prompt
    sees the empty model's bytes."""
    size = getattr(patcher, "size", 0)
    if isinstance(size, int) and not isinstance(size, bool) and 0 < size < (1 << 63):
        return size
    module = getattr(patcher, "model", None)
    if not isinstance(module, torch.nn.Module):
        return 0
    total = 0
    for m in module.modules():
        tensors = list(m._parameters.values())
        tensors += [b for n, b in m._buffers.items() if n not in m._non_persistent_buffers_set]
        for t in tensors:
            if isinstance(t, torch.Tensor):
                leaves = _subclass.inner_tensors(t) if _subclass.is_wrapper(t) else [t]
                total += sum(x.nbytes for x in leaves)
    return min(total, (1 << 63) - 1)


def entry_of(state: Integration, patcher: Any) -> Optional[ModelEntry]:
    module = getattr(patcher, "model", None)
    return state.owner.get(module) if isinstance(module, torch.nn.Module) else None


def map_modules(state: Integration, module: torch.nn.Module, entry: ModelEntry) -> None:
    for m in module.modules():
        state.owner[m] = entry


def patchers(models: Any) -> List[Any]:
    """The patchers of a load_models_gpu call and the patch models they carry."""
    out, seen = [], set()
    for m in list(models or ()):
        for p in [m] + list(getattr(m, "model_patches_models", lambda: [])()):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def wrap_patcher_init(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        state = current()
        if state is not None:
            register(state, self)
    return __init__
