"""pins' settings in ComfyUI's settings dialog, on the server's side.

Note [ComfyUI settings of pins]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The frontend keeps each user's settings in ``user/<user>/comfy.settings.json``
(ComfyUI's ``/settings`` routes write it); a setting is in the file once the
user has changed it, so a setting absent there leaves pins as ``PINS_CONF``
or its defaults make it, and one present wins over ``PINS_CONF``. At start-up
the node reads the ``default`` user's file (the only user without
``--multi-user``). From the dialog, each change comes to ``POST
/pins/settings`` too (web/pins.js): what pins can change in a running
process (``policy``, ``headroom``: ``pins.configure``) applies at once; the
rest at the next start, and the panel says so.

=====================  ==============  =========================================
setting id             pins            applied
=====================  ==============  =========================================
``pins.Enabled``       enable()        next start (off: no hook goes in)
``pins.Policy``        ``policy``      live
``pins.Headroom``      ``headroom``    live ("" : derived from the machine)
``pins.Share``         ``share``       next start (fixed once pins is in use)
``pins.CpuTargets``    cpu_targets     next start (serve casts to the CPU:
                                       ``--cpu``, where a pin only adds a copy)
=====================  ==============  =========================================
"""
import json
import os
from typing import Any, Dict, List, Optional, Tuple

SETTINGS_FILE = "comfy.settings.json"
POLICIES = ("default", "trace", "mru", "lru", "reuse")
# setting id -> (pins key or option, applied live)
SETTINGS: Dict[str, Tuple[str, bool]] = {
    "pins.Enabled": ("enabled", False),
    "pins.Policy": ("policy", True),
    "pins.Headroom": ("headroom", True),
    "pins.Share": ("share", False),
    "pins.CpuTargets": ("cpu_targets", False),
}


def settings_path(user_directory: str, user: str = "default") -> str:
    return os.path.join(user_directory, user, SETTINGS_FILE)


def read(path: str) -> Tuple[Dict[str, Any], Optional[str]]:
    """pins' settings in a user's settings file, and a problem with the file
    (unreadable, not JSON) or None. An absent file is no problem: no settings."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as e:
        return {}, f"{path}: {e}"
    if not isinstance(data, dict):
        return {}, f"{path}: not a JSON object"
    return {k: v for k, v in data.items() if k in SETTINGS}, None


def conf_of(settings: Dict[str, Any], live_only: bool = False) -> str:
    """The PINS_CONF text of the settings pins' configuration takes
    (``pins.configure`` applies it); ValueError naming a bad one."""
    parts: List[str] = []
    for sid, value in settings.items():
        key, live = SETTINGS[sid]
        if live_only and not live:
            continue
        if key == "policy":
            if value not in POLICIES:
                raise ValueError(f"setting {sid} must be one of {', '.join(POLICIES)}, got {value!r}")
            if value != "default":
                parts.append(f"policy:{value}")
        elif key == "headroom":
            if not isinstance(value, str):
                raise ValueError(f"setting {sid} must be a size such as 6G, or empty, got {value!r}")
            if value.strip():
                parts.append(f"headroom:{value.strip()}")
        elif key == "share":
            if not isinstance(value, bool):
                raise ValueError(f"setting {sid} must be true or false, got {value!r}")
            parts.append(f"share:{'true' if value else 'false'}")
    return ",".join(parts)


def options_of(settings: Dict[str, Any]) -> Dict[str, Any]:
    """enable()'s options and whether pins is on, from the settings."""
    enabled = settings.get("pins.Enabled", True)
    cpu = settings.get("pins.CpuTargets", False)
    for sid, v in (("pins.Enabled", enabled), ("pins.CpuTargets", cpu)):
        if not isinstance(v, bool):
            raise ValueError(f"setting {sid} must be true or false, got {v!r}")
    return {"enabled": enabled, "cpu_targets": cpu}


def pending(at_start: Dict[str, Any], now: Dict[str, Any]) -> List[str]:
    """The settings changed since start-up that apply only at the next start."""
    return sorted(sid for sid, (_, live) in SETTINGS.items()
                  if not live and at_start.get(sid) != now.get(sid) and sid in now)
