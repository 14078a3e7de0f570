"""The old loader's cast path (``--disable-dynamic-vram``, other GPUs, ComfyUI
before dynamic VRAM): ``comfy.ops.cast_bias_weight``.

Weight and bias of a registered module go through pins, in one gathered pin
and one transfer when they share a dtype (``cast_many_to_device``), else one
cast each; wrapper subclasses (``QuantizedTensor``) through ``_subclass`` (Note
[Wrapper subclasses]). On ComfyUI's offload stream when the caller is
``offloadable`` (the returned triple goes to ``uncast_bias_weight`` as
ComfyUI's would). The module's ``weight_function``/``bias_function`` (lowvram
LoRA patches) then run on the result as in ComfyUI, their factors through
pins (patches). The original serves everything else, counted by reason under
``fallback.<reason>``. The offload stream is taken only once pins knows it
serves the cast (Note [ComfyUI's switches])."""
import functools
import inspect
import logging
import sys

import torch

import torch_pins as pins

from . import casting, patches
from .. import _subclass
from .state import count, current, log_once


def _cast_one(source, device, dtype, non_blocking, model):
    # A wrapper (QuantizedTensor) keeps its dtype here: finish_wrapper then
    # applies ComfyUI's rule for it.
    return pins.cast_to_device(source, device, None if _subclass.is_wrapper(source) else dtype, non_blocking, model)


class _Cast:
    """Weight and bias of a module, brought over by pins; its patch functions
    still to run."""

    def __init__(self, entry, weight, bias, weight_functions, bias_functions):
        self.entry, self.weight, self.bias = entry, weight, bias
        self.weight_functions, self.bias_functions = weight_functions, bias_functions


class _Plan:
    """What a cast of a module through pins takes, decided before any stream is."""

    def __init__(self, entry, weight, bias, dtype, bias_dtype, device, weight_functions, bias_functions):
        self.entry, self.weight, self.bias, self.dtype, self.bias_dtype = entry, weight, bias, dtype, bias_dtype
        self.device, self.weight_functions, self.bias_functions = device, weight_functions, bias_functions


def _plan(state, s, input, dtype, device, bias_dtype):
    """Whether pins serves module ``s``: a _Plan, or a string saying why not."""
    if hasattr(s, "_v"):
        return "dynamic-vram"
    if getattr(s, "weight_lowvram_function", None) is not None or \
            getattr(s, "bias_lowvram_function", None) is not None:
        return "lowvram-function"
    quantized = casting.quantized_type()
    if input is not None:
        if quantized is not None and isinstance(input, quantized):
            return "quantized-input"
        if dtype is None:
            dtype = input.dtype
        if bias_dtype is None:
            bias_dtype = dtype
        if device is None:
            device = input.device
    if device is None:
        return "no-device"
    device = torch.device(device)
    weight = getattr(s, "weight", None)
    bias = getattr(s, "bias", None)
    if not isinstance(weight, torch.Tensor):
        return "no-weight"
    weight_functions = list(getattr(s, "weight_function", ()) or ())
    bias_functions = list(getattr(s, "bias_function", ()) or ())
    why = casting.wants_copy(state, weight, device, dtype, bool(weight_functions))
    if why is None and bias is not None:
        why = casting.wants_copy(state, bias, device, bias_dtype, bool(bias_functions))
    if why is not None:
        return why
    entry = state.owner.get(s)
    if entry is None:
        return "unregistered"
    return _Plan(entry, weight, bias, dtype, bias_dtype, device, weight_functions, bias_functions)


def _cast_module(state, plan):
    """Casts weight and bias of the planned module through pins."""
    entry, weight, bias, dtype, bias_dtype, device = \
        plan.entry, plan.weight, plan.bias, plan.dtype, plan.bias_dtype, plan.device
    weight_functions, bias_functions = plan.weight_functions, plan.bias_functions
    non_blocking = casting.non_blocking(device)
    model = entry.pins_id
    plain = not _subclass.is_wrapper(weight) and not (bias is not None and _subclass.is_wrapper(bias))
    if bias is not None and plain and state.options["gather"] and bias_dtype == dtype:
        w, b = pins.cast_many_to_device([weight, bias], device, dtype, non_blocking, model)
        count("gathered")
    else:
        w = _cast_one(weight, device, dtype, non_blocking, model)
        b = _cast_one(bias, device, bias_dtype, non_blocking, model) if bias is not None else None
    if _subclass.is_wrapper(w):
        w = casting.finish_wrapper(w, dtype, bool(weight_functions))
    if b is not None and _subclass.is_wrapper(b):
        b = casting.finish_wrapper(b, bias_dtype, bool(bias_functions))
    return _Cast(entry, w, b, weight_functions, bias_functions)


def wrap_cast_bias_weight(original):
    params = inspect.signature(original).parameters
    offloadable_at = list(params).index("offloadable") if "offloadable" in params else None

    @functools.wraps(original)
    def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None, *args, **kwargs):
        state = current()
        if state is None:
            return original(s, input, dtype, device, bias_dtype, *args, **kwargs)
        offloadable = kwargs.get("offloadable", False)
        if offloadable_at is not None and len(args) > offloadable_at - 5:
            offloadable = args[offloadable_at - 5]
        stream = None
        try:
            # Whether pins serves it first: a fallback leaves ComfyUI's offload
            # streams as it found them (ComfyUI takes the next one itself).
            cast = _plan(state, s, input, dtype, device, bias_dtype)
            if not isinstance(cast, str):
                # ComfyUI's offload stream where ComfyUI would copy on one: 0.33
                # for an `offloadable` caller (uncast_bias_weight's contract: the
                # compute stream waits for the copies, the stream for the
                # compute before its buffers are reused); 0.3.64 (no
                # `offloadable`) for every cast, with --async-offload.
                if offloadable or offloadable_at is None:
                    stream = casting.offload_stream(cast.device)
                with casting.stream_context(stream):
                    cast = _cast_module(state, cast)
        except Exception as e:
            count("errors")
            log_once(logging.WARNING, f"pins: cast through pins failed, ComfyUI casts instead: "
                                      f"{type(e).__name__}: {e}")
            cast = "error"
        if isinstance(cast, str):
            count(f"fallback.{cast}")
            return original(s, input, dtype, device, bias_dtype, *args, **kwargs)
        count("casts")
        if stream is not None:
            count("offload_stream_casts")
            sync = getattr(sys.modules.get("comfy.model_management"), "sync_stream", None)
            if sync is not None:
                sync(cast.weight.device, stream)
        # The patch functions are ComfyUI's: what they raise is theirs.
        w, b = cast.weight, cast.bias
        if b is not None and cast.bias_functions:
            with patches.scope(state, cast.entry, cast.bias_functions):
                for f in cast.bias_functions:
                    b = f(b)
        if cast.weight_functions:
            with patches.scope(state, cast.entry, cast.weight_functions):
                for f in cast.weight_functions:
                    w = f(w)
        if not offloadable:
            return w, b
        # uncast_bias_weight's triple: the stream, and the buffers copied on it
        # (before the patch functions), which it keeps until the compute used them.
        return w, b, ((stream, cast.weight, cast.bias) if stream is not None else None)
    return cast_bias_weight
