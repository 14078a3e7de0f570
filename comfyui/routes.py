"""The node's routes on ComfyUI's server (``server.PromptServer``):

- ``GET /pins/stats``: ``torch_pins.report()`` (what ``python -m torch_pins
  stats --json`` prints: configuration with sources, counters, models, budget,
  prompts) with ``comfy`` (the integration's counters, or why pins is off) and
  ``settings`` (Note [ComfyUI settings of pins]: the values in the settings
  file, those waiting for the next start). Without torch-pins: ``enabled``
  false and ``why``.
- ``POST /pins/settings``: ``{setting id: value}`` from the settings dialog;
  applies the live ones (``pins.configure``) and answers what is in force, or
  400 with the error naming the setting and the value.

ComfyUI also serves every route under ``/api`` (``/api/pins/stats``).
"""
import logging
from typing import Any, Dict, Optional

from . import settings as pins_settings

_log = logging.getLogger("torch_pins.comfy")


class NodeState:
    """What the node did at start-up: pins on or off and why."""

    def __init__(self) -> None:
        self.enabled = False
        self.why: Optional[str] = None         # why pins is off: missing, mismatch, settings, ...
        self.settings_file = ""
        self.at_start: Dict[str, Any] = {}     # pins' settings read at start-up
        self.applied: Dict[str, Any] = {}      # applied live since


STATE = NodeState()


def have_pins() -> bool:
    """torch-pins imported here (it is neither missing nor mismatched)."""
    return not (STATE.why or "").startswith(("missing", "mismatch"))


def _pins() -> Any:
    import torch_pins

    return torch_pins


def stats_json() -> Dict[str, Any]:
    """The body of ``GET /pins/stats``."""
    if not have_pins():
        return {"enabled": False, "why": STATE.why}
    pins = _pins()
    import torch_pins.comfy

    report = pins.report()
    comfy = dict(torch_pins.comfy.stats())
    if not comfy.get("enabled") and STATE.why:
        comfy["why"] = STATE.why  # the node did not call enable(), or says why it stayed out
    report["comfy"] = comfy
    now, problem = pins_settings.read(STATE.settings_file) if STATE.settings_file else ({}, None)
    report["settings"] = {"file": STATE.settings_file, "problem": problem, "values": now,
                          "next_start": pins_settings.pending(STATE.at_start, now)}
    return report


def apply_settings(body: Any) -> Dict[str, Any]:
    """Applies the live settings of ``body`` (ValueError naming a bad one) and
    says which apply at the next start."""
    if not isinstance(body, dict) or not body:
        raise ValueError(f"the body must be a JSON object of pins settings, got {body!r}")
    unknown = sorted(k for k in body if k not in pins_settings.SETTINGS)
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r} (pins' are {', '.join(pins_settings.SETTINGS)})")
    pins_settings.options_of(body)  # checks the booleans
    conf = pins_settings.conf_of(body, live_only=True)
    if not have_pins():  # all of it waits for a start with torch-pins installed
        return {"applied": "", "next_start": sorted(body), "config": {}}
    if conf:
        _pins().configure(conf)
    STATE.applied.update({k: v for k, v in body.items() if pins_settings.SETTINGS[k][1]})
    later = [k for k in body if not pins_settings.SETTINGS[k][1] and body[k] != STATE.at_start.get(k)]
    # A live setting taken back to its default cannot undo an earlier configure():
    # pins keeps the value until the next start.
    later += [k for k in body if pins_settings.SETTINGS[k][1] and body[k] in ("", "default")
              and _pins().config_sources().get(pins_settings.SETTINGS[k][0]) == "configure()"]
    if conf:
        _log.info("pins: %s applied from ComfyUI's settings", conf)
    return {"applied": conf, "next_start": sorted(later), "config": stats_json().get("config", {})}


def add(server: Any) -> None:
    """Adds the routes to ComfyUI's PromptServer (before it starts serving)."""
    from aiohttp import web

    routes = server.routes

    @routes.get("/pins/stats")
    async def pins_stats(request):
        return web.json_response(stats_json())

    @routes.post("/pins/settings")
    async def pins_apply(request):
        try:
            body = await request.json()
        except ValueError as e:
            return web.json_response({"error": f"the body is not JSON: {e}"}, status=400)
        try:
            return web.json_response(apply_settings(body))
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
