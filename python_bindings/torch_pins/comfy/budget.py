"""One budget with ComfyUI's pin and RAM calls (Note [ComfyUI as pins' host]).

ComfyUI's pin eviction (``free_pins(size, evict_active, loaded)``, the tiers
its RAM-pressure check and ``ensure_pin_budget`` walk) frees pins' pins along
the same tiers first (``loaded`` keeps the prompt's streaming pins, as
ComfyUI's tiers do) and ComfyUI's own after; its page-lock cap
(``ensure_pin_registerable``) counts pins' page-locked bytes with its own;
``free_memory`` frees pins for RAM it is asked for (``ram_required``, or a CPU
device), not for a page-lock request (``pins_required``: ComfyUI's
``ensure_pin_budget`` weighs that one). ComfyUI's RAM-cache release
(``extra_ram_release``) is its own: pins does not give way to it. On the old
loader ``ModelPatcher.pin_weight_to_device``, which page-locks an offloaded
weight in place, does nothing for a registered model (counted
``declined_pins``): pins' pin is its one pinned copy."""
import functools
import inspect
import sys
from typing import Optional

import torch

import torch_pins as pins

from .models import entry_of
from .state import MAX_BYTES, Integration, count, current


def _available_ram() -> Optional[int]:
    mm = sys.modules.get("comfy.model_management")
    probe = getattr(mm, "get_free_memory", None)
    try:
        return int(probe(torch.device("cpu"))) if probe is not None else None
    except Exception:
        return None


def _relieve(state: Integration, need: float) -> int:
    """Frees pins until ``need`` bytes of RAM are available (as ComfyUI measures it)."""
    available = _available_ram()
    if available is None:
        return 0
    shortfall = min(int(need) - available, MAX_BYTES)
    if shortfall <= 0:
        return 0
    freed = int(pins.free_pins(shortfall))
    count("ram_freed_bytes", freed)
    return freed


def wrap_free_memory(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def free_memory(memory_required, device, *args, **kwargs):
        state = current()
        if state is None:
            return original(memory_required, device, *args, **kwargs)
        try:
            bound = signature.bind(memory_required, device, *args, **kwargs).arguments
        except TypeError:
            bound = {}
        # pins_required asks for room to page-lock, not RAM: ComfyUI's
        # ensure_pin_budget weighs it, through free_pins.
        ram = float(bound.get("ram_required", 0) or 0)
        on_cpu = device is None or torch.device(device).type == "cpu"
        if on_cpu:
            ram += float(memory_required or 0)
        if ram > 0:  # pins go before ComfyUI unloads models for RAM
            _relieve(state, ram)
        unloaded = original(memory_required, device, *args, **kwargs)
        if not on_cpu and unloaded:  # the unloaded weights came back to RAM
            _relieve(state, state.options["ram_headroom"])
        return unloaded
    return free_memory


def wrap_free_pins(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def free_pins(size, *args, **kwargs):
        state = current()
        if state is None or size <= 0:
            return original(size, *args, **kwargs)
        try:
            bound = signature.bind(size, *args, **kwargs).arguments
        except TypeError:
            bound = {}
        evict_active, loaded = bool(bound.get("evict_active", False)), bool(bound.get("loaded", False))
        # The same tiers as ComfyUI's walk: pins' pins first, ComfyUI's own
        # (models pins does not serve) for the rest.
        ours = int(pins.free_pins(min(int(size), MAX_BYTES), evict_active, loaded))
        count("ram_freed_bytes", ours)
        if ours >= size:
            return ours
        return ours + original(size - ours, *args, **kwargs)
    return free_pins


def wrap_pin_registerable(original):
    """Note [One page-lock count]: ComfyUI's cap (``MAX_PINNED_MEMORY``) counts
    what ComfyUI page-locks (``TOTAL_PINNED_MEMORY``) and what pins holds
    page-locked (``pins.locked_bytes()``), each once. ComfyUI's prefetcher
    (``prefetch_queue_pop``) asks room for every layer it prefetched, after
    casting them, the layers pins served (already in pins' locked bytes)
    included: those bytes are taken off the request, for ComfyUI's own count
    too. A request from ComfyUI's own pin call is its own, whole."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def ensure_pin_registerable(size, *args, **kwargs):
        state = current()
        mm = sys.modules.get("comfy.model_management")
        if state is None or mm is None:
            return original(size, *args, **kwargs)
        try:
            bound = signature.bind(size, *args, **kwargs).arguments
        except TypeError:
            return original(size, *args, **kwargs)
        param = signature.parameters.get("evict_active")  # ComfyUI's default: True
        evict_active = bool(bound.get("evict_active", param.default if param is not None else True))
        ctx = state.vbar
        if ctx.prefetch and not ctx.comfy_pin:
            served, ctx.served = min(ctx.served, int(size)), 0
            size = int(size) - served
        cap = float(getattr(mm, "MAX_PINNED_MEMORY", -1))
        if cap > 0:
            over = float(getattr(mm, "TOTAL_PINNED_MEMORY", 0)) + pins.locked_bytes() + size - cap
            if over > 0:
                freed = int(pins.free_pins(min(int(over), MAX_BYTES), evict_active))
                count("ram_freed_bytes", freed)
        bound["size"] = size
        return original(**bound)
    return ensure_pin_registerable


def wrap_prefetch(original):
    """``comfy.model_prefetch.prefetch_queue_pop``: counts the layers pins serves
    while it runs (Note [One page-lock count])."""
    @functools.wraps(original)
    def prefetch_queue_pop(*args, **kwargs):
        state = current()
        if state is None or state.vbar.prefetch:
            return original(*args, **kwargs)
        ctx = state.vbar
        ctx.prefetch, ctx.served = True, 0
        try:
            return original(*args, **kwargs)
        finally:
            ctx.prefetch, ctx.served = False, 0
    return prefetch_queue_pop


def wrap_pin_weight(original):
    @functools.wraps(original)
    def pin_weight_to_device(self, key, *args, **kwargs):
        state = current()
        if state is not None:
            entry = entry_of(state, self)
            device = getattr(self, "load_device", None)
            if entry is not None and (state.options["cpu_targets"] or torch.device(device).type != "cpu"):
                # pins' pin of this weight is its one pinned copy, in pins' budget.
                count("declined_pins")
                return None
        return original(self, key, *args, **kwargs)
    return pin_weight_to_device
