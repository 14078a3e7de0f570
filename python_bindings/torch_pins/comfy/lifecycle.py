"""Prompts, nodes, loads and unloads (Note [ComfyUI as pins' host]).

Boundaries come from ComfyUI's own tracking where it has it: the prompt from
``comfy.model_patcher.PromptModelTracker`` (start, the models it adds, end), a
node's end from ``comfy.model_management.reset_cast_buffers`` under dynamic
VRAM; the executor (``PromptExecutor.execute_async``, ``execution.execute``)
where it does not. ``load_models_gpu`` marks the models it loads as in the
prompt and active (which wakes pins' prewarm while ComfyUI loads them);
``LoadedModel.model_unload`` marks an unloaded model inactive (its pins stay:
the cache it reloads from); ``unload_all_models`` (the ``/free`` endpoint)
marks every model inactive and frees every pin. After each load and unload,
how much of the model stays on its device (``ModelPatcher.loaded_size()`` of
``model_size()``) goes to ``pins.set_device_bytes``: pins sees the loads'
copies, not what leaves the device (Note [Spared layers on the device] in
csrc/balancer/pin_table.h)."""
import contextlib
import functools
import inspect
import logging
import sys
from typing import Optional

import torch_pins as pins

from .models import entry_of, map_modules, patchers, register
from .state import MAX_BYTES, Integration, count, current, log


def wrap_load_models_gpu(original):
    @functools.wraps(original)
    def load_models_gpu(models, *args, **kwargs):
        state = current()
        if state is not None:
            ids = []
            for patcher in patchers(models):
                entry = register(state, patcher)
                if entry is not None:
                    module = entry.module()
                    if module is not None:  # layers added since registration
                        map_modules(state, module, entry)
                    ids.append(entry.pins_id)
            if ids:
                pins.mark_prompt(ids)
                for i in ids:
                    pins.set_active(i, True)
        result = original(models, *args, **kwargs)
        if state is not None:
            for patcher in patchers(models):
                entry = entry_of(state, patcher)
                if entry is not None:
                    _say_device_bytes(entry.pins_id, patcher)
        return result
    return load_models_gpu


def _say_device_bytes(pins_id: int, patcher) -> None:
    """How much of the model ComfyUI keeps on its device now, where the patcher
    says (``loaded_size`` and ``model_size``, in every release pins supports)."""
    loaded_size, model_size = getattr(patcher, "loaded_size", None), getattr(patcher, "model_size", None)
    if not callable(loaded_size) or not callable(model_size):
        return
    on_device, total = int(loaded_size()), int(model_size())
    with contextlib.suppress(ValueError):  # forgotten meanwhile
        pins.set_device_bytes(pins_id, max(on_device, 0), max(total, 0))


def wrap_model_unload(original):
    @functools.wraps(original)
    def model_unload(self, *args, **kwargs):
        unloaded = original(self, *args, **kwargs)
        state = current()
        patcher = getattr(self, "model", None)  # the LoadedModel's ModelPatcher
        entry = entry_of(state, patcher) if state is not None else None
        if entry is not None:
            if unloaded:
                _set_inactive(entry.pins_id)
            _say_device_bytes(entry.pins_id, patcher)  # a partial unload too
        return unloaded
    return model_unload


def _set_inactive(pins_id: int) -> None:
    with contextlib.suppress(ValueError):  # forgotten meanwhile
        pins.set_active(pins_id, False)


def wrap_unload_all(original):
    @functools.wraps(original)
    def unload_all_models(*args, **kwargs):
        result = original(*args, **kwargs)
        state = current()
        if state is not None:
            with state.lock:
                ids = [e.pins_id for e in state.entries.values()]
            for i in ids:
                _set_inactive(i)
            freed = int(pins.free_pins(MAX_BYTES, True))
            count("ram_freed_bytes", freed)
            count("unload_all")
        return result
    return unload_all_models


# --- prompt and node boundaries ---------------------------------------------------

def _prompt_started(state: Integration) -> None:
    pins.mark_prompt([])
    state.prompt_open = True


def prompt_ended(state: Integration) -> None:
    state.prompt_open = False
    pins.end_prompt()
    if log.isEnabledFor(logging.DEBUG):
        log.debug("pins: prompt done\n%s", pins.summary())


def _tracker_drives(state: Optional[Integration]) -> bool:
    """ComfyUI's PromptModelTracker marks the prompt: the executor's hooks stand aside."""
    return state is not None and "comfy.model_patcher.PromptModelTracker.start" in state.hooks \
        and "comfy.model_patcher.PromptModelTracker.end" in state.hooks


def _reset_drives(state: Optional[Integration]) -> bool:
    """Under dynamic VRAM ComfyUI's reset_cast_buffers ends each node: execution.execute's hook stands aside."""
    if state is None or "comfy.model_management.reset_cast_buffers" not in state.hooks:
        return False
    return bool(getattr(sys.modules.get("comfy.memory_management"), "aimdo_enabled", False))


def wrap_tracker_start(original):
    @functools.wraps(original)
    def start(self, *args, **kwargs):
        result = original(self, *args, **kwargs)  # ends the tracker's previous prompt first
        state = current()
        if state is not None:
            if state.prompt_open:
                prompt_ended(state)
            _prompt_started(state)
        return result
    return start


def wrap_tracker_add(original):
    @functools.wraps(original)
    def add(self, outputs, *args, **kwargs):
        result = original(self, outputs, *args, **kwargs)
        state = current()
        if state is not None:
            ids = []
            for patcher in list(getattr(self, "models", {}).values()):
                entry = register(state, patcher)
                if entry is not None:
                    ids.append(entry.pins_id)
            if ids:
                pins.mark_prompt(ids)
        return result
    return add


def wrap_tracker_end(original):
    @functools.wraps(original)
    def end(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state = current()
        if state is not None and state.prompt_open:
            prompt_ended(state)
        return result
    return end


def wrap_reset_cast_buffers(original):
    @functools.wraps(original)
    def reset_cast_buffers(*args, **kwargs):
        result = original(*args, **kwargs)
        if _reset_drives(current()):
            pins.end_node()
        return result
    return reset_cast_buffers


def wrap_prompt(original):
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def run_prompt(self, *args, **kwargs):
            state = current()
            if state is None or _tracker_drives(state):
                return await original(self, *args, **kwargs)
            _prompt_started(state)
            try:
                return await original(self, *args, **kwargs)
            finally:
                prompt_ended(state)
        return run_prompt

    @functools.wraps(original)
    def run_prompt_sync(self, *args, **kwargs):
        state = current()
        if state is None or _tracker_drives(state):
            return original(self, *args, **kwargs)
        _prompt_started(state)
        try:
            return original(self, *args, **kwargs)
        finally:
            prompt_ended(state)
    return run_prompt_sync


def _node_ended() -> None:
    state = current()
    if state is not None and not _reset_drives(state):
        pins.end_node()


def wrap_node(original):
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def execute(*args, **kwargs):
            try:
                return await original(*args, **kwargs)
            finally:
                _node_ended()
        return execute

    @functools.wraps(original)
    def execute_sync(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            _node_ended()
    return execute_sync
