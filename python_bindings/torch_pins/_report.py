"""What pins holds and has done, as one JSON object: ``python -m torch_pins
stats --json`` prints it, ComfyUI's ``GET /pins/stats`` route (the node package
in comfyui/) serves it, and ``stats --url`` prints a served one as the table of
a local ``stats``.

Note [Prompt history]
~~~~~~~~~~~~~~~~~~~~~
:func:`torch_pins.end_prompt` records what the prompt moved: the change of a
few counters (hits, misses, the bytes served from pins and copied at a miss,
the bytes read from files into pins, evictions) since the previous
``end_prompt``, with the bytes the process read from storage meanwhile
(``read_bytes`` of ``/proc/self/io``: page-cache misses of mmaps and reads
alike, pins' own and everyone else's in the process) and what was pinned at
the end. The last :data:`PROMPT_HISTORY` prompts are kept, in order; "this
prompt" is the change since the last record. A prompt ended by the op itself
(TorchScript, C++) is not recorded. Recording reads ``stats()`` once: once per
prompt, never on the cast path.
"""
import collections
import os
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional

PROMPT_HISTORY = 32
# The counters whose change a prompt record holds.
MOVED = ("hits", "misses", "hit_bytes", "miss_bytes", "file_fill_bytes", "evictions", "evicted_bytes", "bypassed")
SUBSETS = ("weights", "weights-loaded", "patches", "patches-loaded")


def disk_read_bytes() -> Optional[int]:
    """The bytes this process has read from storage (Linux's /proc/self/io), or None."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def memory() -> Dict[str, Optional[int]]:
    """Total and available RAM in bytes as /proc/meminfo says (None where unreadable)."""
    out: Dict[str, Optional[int]] = {"total_bytes": None, "available_bytes": None}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    out["total_bytes" if key == "MemTotal" else "available_bytes"] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


class PromptHistory:
    """Note [Prompt history]."""

    def __init__(self, counters: Callable[[], Dict[str, int]], keep: int = PROMPT_HISTORY):
        self._counters = counters
        self._lock = threading.Lock()
        self._records: Deque[Dict[str, Any]] = collections.deque(maxlen=keep)  # LOCK: _lock
        self._base: Dict[str, int] = {}  # LOCK: _lock; the counters at the last record
        self._base_disk: Optional[int] = disk_read_bytes()  # LOCK: _lock
        self._count = 0  # LOCK: _lock; prompts recorded in this process

    def _moved(self, counters: Dict[str, int], disk: Optional[int]) -> Dict[str, Any]:
        moved: Dict[str, Any] = {k: int(counters.get(k, 0)) - self._base.get(k, 0) for k in MOVED}
        moved["disk_read_bytes"] = None if disk is None or self._base_disk is None else disk - self._base_disk
        return moved

    def record(self) -> Dict[str, Any]:
        """Closes the current prompt's record and returns it."""
        counters, disk = self._counters(), disk_read_bytes()
        with self._lock:
            self._count += 1
            rec = self._moved(counters, disk)
            rec.update(prompt=self._count, ended=time.time(), pinned_bytes=int(counters.get("pinned_bytes", 0)))
            self._records.append(rec)
            self._base = {k: int(counters.get(k, 0)) for k in MOVED}
            self._base_disk = disk
            return rec

    def view(self, counters: Dict[str, int]) -> Dict[str, Any]:
        """The recorded prompts (oldest first), their count, what moved since the
        last one (``current``) and the totals of this process (``total``)."""
        disk = disk_read_bytes()
        total: Dict[str, Any] = {k: int(counters.get(k, 0)) for k in MOVED}
        total["disk_read_bytes"] = disk
        with self._lock:
            return {"recorded": self._count, "last": list(self._records), "current": self._moved(counters, disk),
                    "total": total}


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def models(counters: Dict[str, int]) -> List[Dict[str, Any]]:
    """Each registered model's pins per subset, from ``stats()``'s ``model.<id>.*``
    and ``model.<name>.*`` keys (by id; the name is the label whose id matches)."""
    ids = sorted({int(k.split(".")[1]) for k in counters if k.startswith("model.") and k.endswith(".id")
                  and k.split(".")[1].isdigit() and counters[k] == int(k.split(".")[1])})
    names = {}
    for k, v in counters.items():
        parts = k.split(".")
        if len(parts) == 3 and parts[0] == "model" and parts[2] == "id" and parts[1] != str(v):
            names[int(v)] = parts[1]
    out = []
    for i in ids:
        p = f"model.{i}."
        out.append({
            "id": i, "name": names.get(i, str(i)),
            **{k: _int(counters.get(p + k)) for k in ("pins", "bytes", "hits", "misses", "hit_bytes", "miss_bytes",
                                                      "evictions", "size")},
            "active": bool(counters.get(p + "active")), "in_prompt": bool(counters.get(p + "in_prompt")),
            "subsets": {s: {k: _int(counters.get(f"{p}{s}.{k}")) for k in ("pins", "bytes", "hits", "misses")}
                        for s in SUBSETS},
        })
    return out


def budget(config: Dict[str, str], counters: Dict[str, int]) -> Dict[str, Optional[int]]:
    """Pinned bytes against what the budget lets pins hold now: what it holds plus
    the available RAM above its reserve line, max(headroom/2, pin_reserve)
    (DESIGN.md "Budget"; /proc/meminfo's MemAvailable, not a cgroup's)."""
    mem = memory()
    headroom, reserve = _int_str(config.get("headroom")), _int_str(config.get("pin_reserve"))
    line = max(headroom // 2, reserve)
    pinned = _int(counters.get("pinned_bytes"))
    available = mem["available_bytes"]
    return {"pinned_bytes": pinned, "locked_bytes": _int(counters.get("locked_bytes")),
            "headroom_bytes": headroom, "reserve_line_bytes": line, "available_bytes": available,
            "total_bytes": mem["total_bytes"],
            "limit_bytes": None if available is None else pinned + max(0, available - line)}


def _int_str(v: Optional[str]) -> int:
    try:
        return int(v) if v is not None else 0
    except ValueError:
        return 0


def report(history: Optional[PromptHistory] = None) -> Dict[str, Any]:
    """The library, its configuration (each key's value and source), backend and
    every counter; with ``history``, the models, the budget and the prompts."""
    import torch

    import torch_pins as pins

    from . import _library

    s = pins.stats()
    path = pins.library_path()
    values, sources = pins.config(), pins.config_sources()
    out: Dict[str, Any] = {
        "version": pins.__version__, "library": path, "built_against": _library.built_against(path),
        "torch": torch.__version__, "releases": _library.supported_releases(),
        "PINS_CONF": os.environ.get("PINS_CONF", ""),
        "config": {k: {"value": v, "source": sources.get(k, "unknown")} for k, v in values.items()},
        "backend": ",".join(sorted(k[len("backend."):] for k, v in s.items() if k.startswith("backend.") and v)),
        "counters": dict(s),
    }
    if history is not None:
        out["models"] = models(s)
        out["budget"] = budget(values, s)
        out["prompts"] = history.view(s)
    return out


def _size(n: Optional[int]) -> str:
    if n is None:
        return "unknown"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def text(r: Dict[str, Any]) -> str:
    """A report as the lines ``python -m torch_pins stats`` prints."""
    lines = [f"torch-pins {r['version']}",
             f"library    {r['library']} (built against torch {r.get('built_against') or 'unknown'})",
             f"torch      {r['torch']}",
             f"releases   {', '.join(r.get('releases') or ()) or 'none in the package'} (the package's builds)",
             f"PINS_CONF  {r['PINS_CONF'] or '(unset)'}",
             f"backend    {r['backend'] or 'unknown'}", ""]
    comfy = r.get("comfy")
    if comfy is not None:
        state = "on" if comfy.get("enabled") else f"off ({comfy.get('why') or comfy.get('reason') or 'unknown'})"
        lines += [f"ComfyUI    pins {state}" + (f", {comfy['mode']} mode" if comfy.get("mode") else ""), ""]
    # The configuration in force: `key value (source)`, sizes in bytes.
    lines.append("configuration: key, value (sizes in bytes), where it came from")
    config = r["config"]
    width = max(map(len, config), default=0)
    lines += [f"{k:<{width}} {c['value']} ({c['source']})" for k, c in config.items()]
    if "budget" in r:
        b = r["budget"]
        lines += ["", f"budget     {_size(b['pinned_bytes'])} pinned of {_size(b['limit_bytes'])} "
                      f"(available RAM {_size(b['available_bytes'])}, reserve line {_size(b['reserve_line_bytes'])})"]
        for m in r["models"]:
            parts = ", ".join(f"{s} {_size(v['bytes'])}" for s, v in m["subsets"].items() if v["bytes"])
            lines.append(f"model {m['id']} {m['name']}: {_size(m['bytes'])} pinned ({parts or 'none'}), "
                         f"{m['hits']} hits, {m['misses']} misses")
        p = r["prompts"]
        recent = [(f"prompt {x['prompt']}", x) for x in p["last"][-3:]]
        for label, rec in [("in total", p["total"]), ("this prompt", p["current"])] + recent:
            lines.append(f"{label}: {rec['hits']} hits, {rec['misses']} misses, {_size(rec['hit_bytes'])} served "
                         f"from pins, {_size(rec['disk_read_bytes'])} read from disk")
    from . import Stats  # the package imports this module: late

    lines += ["", str(Stats(r["counters"]))]
    return "\n".join(lines)
