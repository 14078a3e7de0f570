"""Safetensors files read by ``pins.load_file`` (``enable(load_files=False)``
leaves loading to ComfyUI).

``comfy.utils.load_torch_file`` reads every checkpoint, UNet, CLIP, VAE, LoRA,
ControlNet and upscale model file ComfyUI loads (under dynamic VRAM it reads
safetensors with ``comfy.utils.load_safetensors``, called only from there, so
one hook covers both modes); ``comfy.clip_vision`` and
``comfy.bg_removal_model`` took copies of it by name at import, hooked too. A
safetensors file (``.safetensors`` or ``.sft``, ComfyUI's test) loaded to the
CPU is read with ``pins.load_file``: CPU tensors over a private mapping pins
knows, so a pin of one is filled from the file (O_DIRECT), not through a
second copy in the page cache. Under dynamic VRAM ComfyUI assigns them to the
model as its weights; the old loader copies them into the model's own (then
only what it keeps as loaded, LoRA factors, is filled from the file).

The result is ComfyUI's: the same keys in its order (safe_open's sorted keys,
the header's under dynamic VRAM), dtypes, shapes and values, and with
``return_metadata`` the header's ``__metadata__`` (read here: an 8-byte
little-endian length, then JSON), None without one (``{}`` under dynamic VRAM,
as there). ComfyUI's own loader reads the rest, counted under
``load_fallback.<reason>``: other files (``torch.load``, where ``safe_load``
and ``--mmap-torch-files`` act), another ``device``, ``--disable-mmap`` on the
old loader, a file ``pins.load_file`` refuses (a dtype without a torch type,
malformed, unreadable) and, under dynamic VRAM, one with a dtype
``load_safetensors`` has no type for (``comfy.utils._TYPES``): the user gets
ComfyUI's result or its error.

Not reached: code that took ``load_torch_file`` by name before ``enable()``
(a custom node's ``from comfy.utils import load_torch_file``) and direct
``safetensors`` calls (text-encoder embeddings, latents). Under dynamic VRAM
these tensors carry no comfy-aimdo file slice: what ComfyUI casts from them
itself (lowvram LoRA patches, modules pins does not serve) is copied through
the mapping rather than read from the file, and the mapping is not bounced at
a node's end."""
import functools
import inspect
import json
import logging
import struct
import sys
from typing import Any, Dict

import torch

import torch_pins as pins

from .state import Integration, count, current, log_once


def _safetensors_header(path: str) -> Dict[str, Any]:
    """The JSON header of a safetensors file: an 8-byte little-endian length, then
    that many bytes of JSON (pins.load_file has checked the file already)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def _load_file(state: Integration, path: Any, device: Any, return_metadata: bool) -> Any:
    """What ComfyUI's load_torch_file(path, device=device, return_metadata=...)
    returns, over pins' mapping of the file; a string says why ComfyUI's own
    loader reads it instead. comfy.utils' switches are read at each call, as
    ComfyUI reads them."""
    if not isinstance(path, str) or not path.lower().endswith((".safetensors", ".sft")):
        return "not-safetensors"  # torch.load: safe_load and --mmap-torch-files are ComfyUI's
    if device is not None and not (isinstance(device, torch.device) and device.type == "cpu"):
        return "device"
    utils = sys.modules.get("comfy.utils")
    # ComfyUI under dynamic VRAM reads safetensors with its load_safetensors
    # (comfy-aimdo's mapping), the old loader with safetensors' safe_open.
    aimdo = hasattr(utils, "load_safetensors") and \
        bool(getattr(sys.modules.get("comfy.memory_management"), "aimdo_enabled", False))
    if not aimdo and getattr(utils, "DISABLE_MMAP", False):
        return "disable-mmap"  # --disable-mmap: safe_open's tensors copied out of the mapping
    try:
        sd = pins.load_file(path)
        header = _safetensors_header(path) if aimdo or return_metadata else {}
    except Exception as e:  # noqa: BLE001  (refused, unreadable: ComfyUI's loader, and its error, decide)
        log_once(logging.INFO, f"pins: pins cannot load {path} ({type(e).__name__}: {e}); "
                               f"ComfyUI's loader reads it")
        return "refused"
    known = getattr(utils, "_TYPES", None) if aimdo else None
    if isinstance(known, dict) and any(isinstance(v, dict) and v.get("dtype") not in known
                                       for k, v in header.items() if k != "__metadata__"):
        return "dtype"  # a dtype load_safetensors has no torch type for: its error
    # The order ComfyUI's dict has: the header's under dynamic VRAM, safe_open's
    # keys() (sorted) otherwise.
    order = [k for k in header if k != "__metadata__"] if aimdo else sorted(sd)
    if len(order) != len(sd) or any(k not in sd for k in order):
        return "changed"  # the file was replaced between the two reads
    out = {k: sd[k] for k in order}
    if not return_metadata:
        return out
    # safe_open's metadata() is None without a __metadata__ entry, load_safetensors' {}.
    return out, header.get("__metadata__", {} if aimdo else None)


def wrap_load_torch_file(original):
    signature = inspect.signature(original)
    path_param = next(iter(signature.parameters))

    @functools.wraps(original)
    def load_torch_file(*args, **kwargs):
        state = current()
        if state is None:
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            loaded = "arguments"  # ComfyUI's own raises what it raises
        else:
            loaded = _load_file(state, bound.get(path_param), bound.get("device"),
                                bool(bound.get("return_metadata", False)))
        if isinstance(loaded, str):
            count(f"load_fallback.{loaded}")
            return original(*args, **kwargs)
        count("loaded_files")
        return loaded
    load_torch_file._pins_wraps = original
    return load_torch_file
