"""Plug pins into ComfyUI: ``torch_pins.comfy.enable()``.

Call it once, in ComfyUI's own Python environment (the node package
``comfyui/`` of the repository does it at start-up; README "ComfyUI"). It replaces a few functions of
the running ComfyUI with wrappers that call the original and pins around it, and
:func:`disable` puts the originals back, so that ComfyUI then runs exactly as
without pins. ``PINS_COMFY=0`` in the environment makes :func:`enable` a no-op.

Note [ComfyUI as pins' host]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
pins is the one pinning backend of the ComfyUI it is enabled in: every weight
of a model ComfyUI loads is pinned once, by pins, within pins' budget, and
ComfyUI's own pinning stands aside for those models. ComfyUI casts in one of
two modes, and pins serves both (a process can hold models of both kinds):
dynamic VRAM (the default on NVIDIA in ComfyUI 0.33, ``comfy-aimdo``;
``comfy.memory_management.aimdo_enabled``; dynamic_vram), where no aimdo host
buffer is made for a layer pins serves and ComfyUI's pin accounting
(``TOTAL_PINNED_MEMORY``) stays at what it pins itself; and the old loader
(``--disable-dynamic-vram``, other GPUs, ComfyUI before it; old_loader). One
budget with ComfyUI's pin and RAM calls (budget); prompt and node boundaries
from ComfyUI's own tracking where it has it (lifecycle).

Note [ComfyUI's switches]
~~~~~~~~~~~~~~~~~~~~~~~~~
A ComfyUI switch about pinning wins over pins, and the INFO line of
:func:`enable` says what pins does under it: ``--disable-pinned-memory``
(ComfyUI pins nothing) leaves pins out, no hook in; ``--fast-disk`` (ComfyUI
pins no layer that keeps a place in VRAM: it asks ``pin_memory`` only for the
others) registers every model ``fast_disk`` and pins only what ComfyUI would
pin: no ``-loaded`` pin; ``--cpu``
serves nothing unless ``cpu_targets``. ``--async-offload`` (0.3.64: every cast
of the old loader on an offload stream) is honoured by old_loader.

The package, one concern a module: ``hooks`` (the table of every hooked
function, Note [ComfyUI hook points], and the code that installs and removes
them), ``versions`` (ComfyUI's version, its modules, the import hook for those
it imports later), ``models`` (registration), ``casting`` with ``old_loader``,
``dynamic_vram`` and ``patches`` (the cast paths), ``lifecycle``, ``budget``,
``writes`` (invalidation), ``loading`` (safetensors through ``pins.load_file``),
``gguf`` (ComfyUI-GGUF's layers) and ``state`` (options, counters, log).
Only the names below are its API.
"""
import contextlib
import os
import sys
from typing import Any, Dict, Iterator, Optional

import torch

import torch_pins as pins

from . import hooks, state as _state_module
from .hooks import Hooks
from .state import Integration, current, enable_lock, log
from .versions import comfy_version

__all__ = ["enable", "disable", "enabled", "is_enabled", "stats", "model_id", "Hooks", "ENV_VAR"]

ENV_VAR = "PINS_COMFY"
# Why pins is off, for stats(): set by enable() when it stays out and by disable().
_off: Dict[str, Any] = {"why": "enable() was not called"}


def is_enabled() -> bool:
    """Whether the hooks are installed now."""
    return current() is not None


def _env_off() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() in ("0", "false", "off", "no")


def enable(*, cpu_targets: bool = False, fast_disk: bool = False, gather: bool = True, patches: bool = True,
           load_files: bool = True, ram_headroom: int = 4 << 30) -> Hooks:
    """Installs the hooks of Note [ComfyUI hook points] into the ComfyUI that is
    importable (``comfy.*``; ``execution`` when ComfyUI imports it) and returns
    them as :class:`Hooks`, true when pins serves casts. ``PINS_COMFY=0`` returns
    an empty, false one. Calling it again while enabled keeps the options of the
    first call, installs what has become available since, and returns the same
    report.

    - ``cpu_targets``: serve casts whose target is the CPU too (ComfyUI's
      ``--cpu``, or a manual cast that converts dtype on the CPU). Off by default:
      there a pin only adds a copy of each weight in RAM, so with ``--cpu`` pins
      does nothing (the INFO line says so). The tests use it.
    - ``fast_disk``: register models with no ``-loaded`` pins (disk reads are cheap).
    - ``gather``: weight and bias of a module in one pin and one transfer.
    - ``patches``: route LoRA factors of lowvram patches through pins.
    - ``load_files``: ComfyUI's ``load_torch_file`` reads safetensors files
      with ``pins.load_file`` (loading).
    - ``ram_headroom``: bytes of available RAM ``free_memory`` keeps free after
      ComfyUI unloaded models from an accelerator into RAM.

    Raises ``ImportError`` when ComfyUI's ``comfy`` package cannot be imported.
    """
    global _off
    if _env_off():
        log.info("pins: %s=%s, not enabled", ENV_VAR, os.environ[ENV_VAR])
        _off = {"why": f"{ENV_VAR}={os.environ[ENV_VAR]} in the environment"}
        report = Hooks()
        report.reason = _off["why"]
        return report
    with enable_lock:
        state = current()
        if state is not None:
            hooks.install_all(state)
            return hooks.report(state)
        try:
            import comfy.model_management  # noqa: F401  (ComfyUI itself; fails clearly outside it)
        except ImportError as e:
            raise ImportError(f"torch_pins.comfy.enable() needs ComfyUI importable (its 'comfy' package): {e}") from e
        if ram_headroom < 0:
            raise ValueError(f"ram_headroom must be >= 0, got {ram_headroom}")
        args = getattr(sys.modules.get("comfy.cli_args"), "args", None)
        # Note [ComfyUI's switches]: --fast-disk makes every model fast_disk.
        comfy_fast_disk = bool(getattr(args, "fast_disk", False))
        state = Integration(dict(cpu_targets=cpu_targets, fast_disk=fast_disk or comfy_fast_disk,
                                 comfy_fast_disk=comfy_fast_disk, gather=gather, patches=patches,
                                 load_files=load_files, ram_headroom=int(ram_headroom)))
        memory = sys.modules.get("comfy.memory_management")
        state.mode = "dynamic-vram" if getattr(memory, "aimdo_enabled", False) else "old-loader"
        if getattr(args, "disable_pinned_memory", False):
            report = hooks.report(state, reason="--disable-pinned-memory: ComfyUI pins nothing, and neither does pins")
            _off = {"why": report.reason}
            _announce(state, report)
            return report
        _state_module.set_current(state)
        try:
            hooks.install_all(state)
        except BaseException:
            hooks.uninstall(state)
            _state_module.set_current(None)
            raise
        report = hooks.report(state)
        if not report.active:
            # Stay out cleanly: no registration, no cast, no budget hook.
            hooks.uninstall(state)
            _state_module.set_current(None)
            report = hooks.report(state, reason=report.reason)
            _off = {"why": report.reason, "missing": list(report.missing), "failed": dict(report.failed)}
        _announce(state, report)
        return report


def disable() -> None:
    """Puts ComfyUI's functions back and forgets the models registered here."""
    global _off
    with enable_lock:
        state = current()
        if state is None:
            return
        _state_module.set_current(None)
        _off = {"why": "disable() was called"}
        hooks.uninstall(state)
    if state.prompt_open:
        pins.end_prompt()
    with state.lock:
        entries = list(state.entries.values())
        state.entries.clear()
    for entry in entries:
        if entry.finalizer is not None:
            entry.finalizer.detach()
        pins.forget_model(entry.pins_id)


@contextlib.contextmanager
def enabled(**options) -> Iterator[Hooks]:
    """``with pins.comfy.enabled():`` enables for the block (unless it was enabled
    already, or ``PINS_COMFY=0``) and disables again at its end."""
    was = is_enabled()
    report = enable(**options)
    try:
        yield report
    finally:
        if is_enabled() and not was:
            disable()


def stats() -> Dict[str, Any]:
    """The integration's own counters: ``casts`` (served through pins by
    ``cast_bias_weight``), ``vbar_casts`` (by ``cast_to_gathered``; the
    factors of lowvram LoRA patches there: ``vbar_patch_casts``),
    ``gguf_casts`` (ComfyUI-GGUF's weights and biases, Note [ComfyUI-GGUF]),
    ``fallback.<reason>``, ``patch_casts``, ``declined_pins``, ``invalidations``
    and ``invalidated_bytes``, ``ram_freed_bytes``, ``errors``, ``models``,
    ``loaded_files`` (read by ``pins.load_file`` for ``load_torch_file``) and
    ``load_fallback.<reason>`` (read by ComfyUI's loader); and
    ``mode``, ``hooks``, ``missing``, ``failed``, ``awaited``. They count what
    runs eagerly, not in a compiled model (Note [Bookkeeping under
    torch.compile]); the cache's counters, in ``pins.stats()``, count every
    cast. While pins is off: ``enabled`` false and ``why`` (never enabled,
    ``PINS_COMFY=0``, ``--disable-pinned-memory``, the hooks that make pins
    serve casts missing, ``disable()``), with the ``missing`` hook points and
    the modules that ``failed`` to import when that is why."""
    state = current()
    if state is None:
        return {"enabled": False, **_off}
    out: Dict[str, Any] = dict(state.counters)
    out["enabled"] = True
    out["mode"] = state.mode
    out["models"] = len(state.entries)
    out["hooks"] = sorted(state.hooks)
    out["missing"] = list(state.missing)
    out["failed"] = dict(state.failed)
    out["awaited"] = sorted(state.awaited)
    return out


def model_id(obj: Any) -> int:
    """The pins model id of a ModelPatcher or of its weight module; -1 if none."""
    state = current()
    if state is None:
        return -1
    module = getattr(obj, "model", obj)
    entry = state.owner.get(module) if isinstance(module, torch.nn.Module) else None
    return entry.pins_id if entry is not None else -1


def _switches(state: Integration) -> str:
    """What pins does under the ComfyUI switches given (Note [ComfyUI's switches])."""
    args = getattr(sys.modules.get("comfy.cli_args"), "args", None)
    said = []
    if getattr(args, "disable_pinned_memory", False):
        said.append("--disable-pinned-memory: pins pins nothing (no hook in)")
    else:
        if getattr(args, "fast_disk", False):
            said.append("--fast-disk: no pin of a loaded weight (those reload from disk), streamed weights pinned")
        if getattr(args, "cpu", False) and not state.options["cpu_targets"]:
            said.append("--cpu: every cast targets the CPU, so pins serves none (enable(cpu_targets=True) to "
                        "serve them)")
    return "".join(f"; {s}" for s in said)


def _announce(state: Integration, report: Hooks) -> None:
    conf = pins.config()
    switched = _switches(state)
    log.info("torch_pins %s: %s in ComfyUI %s (%s mode), %d hooks in%s; policy %s, headroom %s, pin_reserve %s, "
             "backend %s%s", pins.__version__, "active" if report.active else "INACTIVE", comfy_version(),
             state.mode, len(report), f", awaiting {', '.join(report.awaited)}" if report.awaited else "",
             conf.get("policy", "?"), _gib(conf.get("headroom")), _gib(conf.get("pin_reserve")),
             conf.get("backend", "?"), switched)
    if report.reason.startswith("--disable-pinned-memory"):
        return  # the user's switch, said in the line above
    if not report.active:
        log.warning("pins: pins is INACTIVE in this ComfyUI: %s%s. No hook is left in: ComfyUI runs "
                    "as without pins.", report.reason,
                    "".join(f"; {m} failed to import ({e})" for m, e in report.failed.items()))
    if report.missing:
        log.info("pins: this ComfyUI lacks %s; those hooks are left out", ", ".join(report.missing))


def _gib(value: Optional[str]) -> str:
    try:
        return f"{int(value) / (1 << 30):.1f} GiB"
    except (TypeError, ValueError):
        return str(value)
