"""pins for ComfyUI: the node package.

ComfyUI imports this folder from ``custom_nodes/`` at start-up (installed from
the Comfy registry with ``comfy node install``/ComfyUI-Manager, or copied or
cloned there). It adds no node: it plugs pins into ComfyUI
(``torch_pins.comfy.enable()``) with the options of ComfyUI's settings dialog
(settings.py, Note [ComfyUI settings of pins]), adds the ``/pins/stats`` and
``/pins/settings`` routes (routes.py) and serves web/pins.js: pins' settings
and its sidebar panel.

When torch-pins is missing from ComfyUI's Python environment, or does not load
into it (a build for another torch release, a release older than
:data:`REQUIRES`), ComfyUI's log gets one line saying so and what to run, and
ComfyUI runs as without pins; the panel says why too.
"""
import logging
import sys

from . import routes, settings

NODE_CLASS_MAPPINGS: dict = {}  # no node of its own
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
WEB_DIRECTORY = "./web"
REQUIRES = (0, 1, 0)  # the oldest torch-pins with what this node calls (torch_pins.report)

_log = logging.getLogger("torch_pins.comfy")


def _release(version: str) -> tuple:
    parts = []
    for p in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _off(why: str, level: int = logging.WARNING) -> None:
    routes.STATE.why = why
    _log.log(level, "pins: %s", why)


def _start() -> None:
    state = routes.STATE
    try:
        import folder_paths

        state.settings_file = settings.settings_path(folder_paths.get_user_directory())
    except Exception as e:  # noqa: BLE001  (an older ComfyUI: no settings read, pins' own configuration)
        _log.debug("pins: no user directory (%s); ComfyUI's settings are not read", e)
    values, problem = settings.read(state.settings_file) if state.settings_file else ({}, None)
    if problem:
        _log.warning("pins: ComfyUI's settings file is not read (%s); pins uses PINS_CONF and its defaults", problem)
    state.at_start = values
    python = sys.executable
    try:
        import torch_pins
    except ModuleNotFoundError as e:
        if e.name != "torch_pins":
            raise
        return _off(f"missing: torch-pins is not installed in this ComfyUI's Python ({python}); install it with "
                    f"`{python} -m pip install torch-pins` and restart ComfyUI. ComfyUI runs without pins.")
    except ImportError as e:  # no build for this torch release, or the library does not load
        text = str(e).removeprefix("pins: ")
        return _off(f"mismatch: torch-pins does not load into this ComfyUI ({text}). ComfyUI runs without pins.")
    version = getattr(torch_pins, "__version__", "0")
    if _release(version) < REQUIRES or not hasattr(torch_pins, "report"):
        need = ".".join(map(str, REQUIRES))
        return _off(f"mismatch: torch-pins {version} is older than this node needs ({need}); `{python} -m pip "
                    f"install -U torch-pins` and restart ComfyUI. ComfyUI runs without pins.")
    try:
        options = settings.options_of(values)
        conf = settings.conf_of(values)
        if conf and options["enabled"]:
            torch_pins.configure(conf)
    except ValueError as e:  # a setting pins refuses: its error names it
        return _off(f"failed: ComfyUI's settings for pins are refused ({e}); fix them in the settings dialog "
                    f"and restart. ComfyUI runs without pins.")
    if not options["enabled"]:
        return _off("settings: off in ComfyUI's settings (pins.Enabled); ComfyUI runs without pins.", logging.INFO)
    import torch_pins.comfy

    hooks = torch_pins.comfy.enable(cpu_targets=options["cpu_targets"])
    state.enabled = bool(hooks)
    if not state.enabled:  # enable() logged why
        state.why = hooks.reason or "not enabled"


def _serve() -> None:
    try:
        import server
    except ImportError:  # imported outside ComfyUI's server (a test, a script): no routes
        return
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    if instance is not None:
        routes.add(instance)


_serve()
try:
    _start()
except Exception as e:  # noqa: BLE001  (whatever it is, one line and ComfyUI goes on)
    _off(f"failed: {type(e).__name__}: {e}. ComfyUI runs without pins.")
