"""Stand-in for comfy_aimdo.control: library loading and per-device contexts.

Nothing is loaded; a "device context" is just the device index, recorded by
init_devices. ModelVBAR and VRAMBuffer ask for it as the real ones do."""

devctxs = []
lib = None  # the real module holds the loaded native library here
_initialized = False


def init(implementation=None, simple_vram_headroom=None, nvml_pressure=False):
    """Real: loads aimdo's native library (CUDA or ROCm flavour) and sets its
    VRAM-headroom and NVML-pressure options; True when it loaded."""
    global _initialized
    _initialized = True
    return True


def init_devices(device_ids):
    """Real: starts aimdo on the given GPU indices (or (index, headroom) pairs),
    True on success. Here: records the indices."""
    global devctxs
    requested = []
    for device_id in device_ids:
        if isinstance(device_id, tuple):
            device_id, _headroom = device_id
        requested.append(int(device_id))
    if not _initialized or not requested:
        return False
    devctxs = requested
    return True


def init_device(device_id, extra_vram_headroom=0):
    """Real: init_devices for one device."""
    return init_devices([(device_id, extra_vram_headroom)])


def get_devctx(device_id):
    """Real: the native context of an initialised device; raises if the device
    was never initialised. Same here (the context is the index)."""
    if device_id is None or int(device_id) not in devctxs:
        raise RuntimeError(f"comfy-aimdo device {device_id} is not initialized")
    return int(device_id)


def deinit():
    """Real: tears the native library down. Here: forgets the devices."""
    global devctxs, _initialized
    devctxs = []
    _initialized = False


def analyze():
    """Real: logs aimdo's view of each device's VRAM (execution.py calls it
    after a node at DEBUG log level). Here: nothing to report."""


def get_total_vram_usage():
    """Real: VRAM that aimdo holds on all devices. Here: resident vbar pages
    plus the cast buffers' bytes."""
    from . import model_vbar, vram_buffer
    return model_vbar._resident_bytes() + vram_buffer._allocated_bytes()


def _set_log_level(_level=None):
    """Real: sets the native library's log level. Here: nothing to set."""


set_log_none = set_log_critical = set_log_error = set_log_warning = _set_log_level
set_log_info = set_log_debug = set_log_verbose = set_log_vverbose = _set_log_level
