"""pins on real files: ``python profiling/demo/demo.py`` (what ``make demo`` runs).

Replays a workflow trace (the simulator's format, docs/SIMULATOR.md) layer by
layer through ``cast_to_device`` on real safetensors files, once per policy
(``lru``, ``mru``, ``trace``) and once without pins (``none``: plain copies from
the mmap-ed tensors, the page cache as the only cache), each in a fresh process,
and measures every run: wall time, bytes read from disk (/proc/self/io), pin
hits and misses, peak RSS. pins-sim replays the same trace on the same modelled
machine; its predicted disk bytes are printed beside the measured ones.

By default it replays ``profiling/traces/demo_wan22_scaled.json`` on synthetic
files that it writes on its first run (a text encoder, two diffusion experts, a
VAE and style LoRAs, 2.7 GB) and checks against their digests when it reuses
them (Note [Demo digests] in files.py). ``--files NAME=PATH,...`` points trace
models at your own safetensors files instead: their layers (tensors grouped by
block, as the simulator groups a parameter list) replace the trace's, in a
derived trace written beside the report. Note [Demo machine] and Note [Demo page cache]
(replay.py) say how a machine larger than the modelled one is made to behave
like it.

Output: progress on standard error, a table, ``report.json`` and ``demo.png``
in ``--out``; the last line is ``RESULT report=<json> plot=<png>``. Exit status
0 when every replay ran; 2 for a bad option, file or trace, or a file or
directory the demo cannot read or write (a full disk, a directory where a file
goes, no permission, a file gone), with one line on standard error that names
it; 1 when a replay failed otherwise. A failed write leaves no partial file.

The demo is part of the source tree, not of the torch_pins package: it needs
the repository's traces and pins-sim, and imports torch_pins (the package
importable here) only in its replay processes. ``python -m torch_pins demo``
runs this file of the checkout the package sits in.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import files
from replay import FILE_ERROR, FILE_ERROR_PREFIX, read_bytes

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(os.path.dirname(_HERE))
REPLAY = os.path.join(_HERE, "replay.py")
DEFAULT_TRACE = os.path.join("profiling", "traces", "demo_wan22_scaled.json")
DEFAULT_OUT = os.path.join("build", "demo")
# How long pins' reading of the demo's meminfo stands (PINS_CONF memory_max_age_us): Note [Demo machine].
DEMO_READING_AGE_US = 1000000
POLICIES = ("none", "lru", "mru", "trace", "reuse")
DEFAULT_POLICIES = ("none", "lru", "mru", "trace")  # reuse on request (--policy)
# The balancer's byte constants of the full-size WAN trace's 32 GiB machine
# (pin_reserve 1 GiB as pins derives it, Note [Derived budget]; the fixed
# pin_slack 256 MiB and relieve_slack 512 MiB) divided by 24 like every size of
# the default trace, whose machine (the headroom included) is that one divided
# by 24. Used with that trace unless --conf says otherwise; another trace gets
# the library's defaults.
DEFAULT_TRACE_CONF = "pin_reserve:43MiB,pin_slack:11MiB,relieve_slack:21MiB"
# Keys a model entry of a trace uses for its size; --files replaces them with "layers".
_SIZE_KEYS = ("params", "group", "max_layer_bytes", "bytes_per_param", "layers", "bytes", "layer_count")
USAGE_ERROR = 2


class DemoError(Exception):
    """A bad option, file or trace: printed as ``demo: <message>``, exit status 2."""


# --- files and directories ------------------------------------------------------------
# Every error the file system gives the demo becomes a FileError naming the
# path and what the demo was doing with it (exit status 2, one line).

def make_dir(path: str, what: str) -> None:
    """Creates directory `path` where it is missing; `what` names it in errors."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:  # exist_ok: something other than a directory is there
        raise DemoError(f"{what} {path!r}: not a directory") from None
    except OSError as e:
        raise files.failed(f"{what} {path!r}: cannot be created", e) from None


def writable_dir(path: str, what: str) -> None:
    """Creates `path` and creates and removes a file in it, so that a directory
    the demo cannot write to is named before any work is done."""
    make_dir(path, what)
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:  # named without the probe's name, which says nothing to the reader
        raise files.failed(f"{what} {path!r}: cannot write there", OSError(e.errno, e.strerror)) from None


def save(path: str, what: str, data) -> None:
    """Writes `data` (bytes, or a function that writes to a binary file) to
    `path`, whole or not at all; `what` names the file in errors."""
    write = data if callable(data) else (lambda f: f.write(data))
    try:
        files.write_atomic(path, write)
    except OSError as e:
        raise files.failed(f"cannot write {what} {path!r}", e) from None


def discard(path: str) -> None:
    """Removes a file written in part, where it can."""
    try:
        os.unlink(path)
    except OSError:
        pass


def json_bytes(doc, indent: Optional[int] = None) -> bytes:
    return json.dumps(doc, indent=indent).encode("utf-8")


# --- sizes, as Note [Size syntax] (csrc/base/size.h) -------------------------------

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(text, what: str) -> int:
    """Bytes of a size such as 4096, 512M, 1.5GiB or 2GB; `what` names the
    option or field in the error."""
    if isinstance(text, bool):
        raise DemoError(f"{what}: expected a size such as 4096, 512M or 1.5GiB, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise DemoError(f"{what}: expected a non-negative size, got {text}")
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise DemoError(f"{what}: expected a size such as 4096, 512M or 1.5GiB, got {text!r}")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


def gib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


# --- the trace ---------------------------------------------------------------------

def _strip_comments(text: str) -> str:
    """JSON with // and /* */ comments (the trace format allows them) as plain JSON."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def load_trace(path: str) -> dict:
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise DemoError(f"--trace {path!r}: no such file") from None
    except OSError as e:
        raise DemoError(f"--trace {path!r}: cannot be read ({e.strerror})") from None
    try:
        doc = json.loads(_strip_comments(text))
    except json.JSONDecodeError as e:
        raise DemoError(f"--trace {path!r}: not a trace: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list) or not isinstance(doc.get("prompts"), list):
        raise DemoError(f"--trace {path!r}: not a trace: expected an object with \"models\" and \"prompts\" "
                        "(docs/SIMULATOR.md, \"Trace format\")")
    return doc


def parse_files_option(text: str, trace: dict) -> Dict[str, str]:
    """``name=path,name=path`` -> {model: path}; every name a model of the trace."""
    names = [m.get("name") for m in trace["models"]]
    out: Dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise DemoError(f"--files: expected MODEL=PATH entries separated by commas, got {item!r}")
        if name not in names:
            raise DemoError(f"--files: {name!r} is not a model of the trace (models: {', '.join(names)})")
        if name in out:
            raise DemoError(f"--files: model {name!r} is given twice")
        out[name] = os.path.abspath(os.path.expanduser(path))
    if not out:
        raise DemoError("--files: no MODEL=PATH entry given")
    return out


def derive_trace(trace: dict, user_files: Dict[str, str], path: str) -> Dict[str, Dict[str, List[List[str]]]]:
    """Replaces each mapped model's layers by its files' (tensors grouped by
    block) and writes the trace to `path`; returns {model: {layer: [[file, tensor], ...]}}."""
    layers: Dict[str, Dict[str, List[List[str]]]] = {}
    for m in trace["models"]:
        where = user_files.get(m.get("name"))
        if where is None:
            continue
        what = f"--files {m['name']}="
        headers = [files.read_header(f, what) for f in files.model_files(where, what)]
        seen: Dict[str, str] = {}
        for h in headers:
            for t in h.tensors:
                if t.name in seen:
                    raise files.FileError(f"{files.named(what, where)}: tensor {t.name!r} is in both {seen[t.name]!r} and "
                                          f"{h.path!r}")
                seen[t.name] = h.path
        groups = files.layers_of(headers)
        for k in _SIZE_KEYS:
            m.pop(k, None)
        m["layers"] = [{"name": name, "bytes": sum(t.nbytes for _, t in ts)} for name, ts in groups]
        layers[m["name"]] = {name: [[f, t.name] for f, t in ts] for name, ts in groups}
    save(path, "the derived trace", json_bytes(trace, indent=1))
    return layers


# --- pins-sim ----------------------------------------------------------------------

def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_sim() -> str:
    """pins-sim where ``python -m torch_pins simulate`` finds it: $PINS_SIM (then
    nowhere else), this checkout's build/bin, PATH. Not through the package's
    command line: it runs this file, and importing it back would make a circle."""
    explicit = os.environ.get("PINS_SIM")
    if explicit:
        if _executable(explicit):
            return explicit
        looked = [f"$PINS_SIM={explicit}, not an executable file"]
    else:
        in_checkout = os.path.join(_CHECKOUT, "build", "bin", "pins-sim")
        if _executable(in_checkout):
            return in_checkout
        on_path = shutil.which("pins-sim")
        if on_path:
            return on_path
        looked = ["$PINS_SIM (unset)", in_checkout, "PATH"]
    raise DemoError(f"pins-sim not found (looked at {', '.join(looked)}): it is a C++ executable of the source "
                    "tree; run `make build` (it lands in build/bin) or set PINS_SIM")


def run_sim(sim: str, trace: str, args: Sequence[str]) -> dict:
    cmd = [sim, "--trace", trace, "--json", *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode < 0:  # SIGXFSZ past a file size limit, for one
        raise DemoError(f"pins-sim ({sim}) was stopped by {signal.Signals(-p.returncode).name}")
    if p.returncode != 0:
        raise DemoError(f"pins-sim refused the trace or an option: {p.stderr.strip() or p.stdout.strip()}")
    return json.loads(p.stdout)


def plan_runs(trace: dict, sim_json: dict, dump_path: str) -> List[dict]:
    """The runs to replay: each prompt's steps (also those that copy nothing:
    set_active still counts as a load) with the simulator's accesses."""
    prompts = {p["name"]: p for p in trace["prompts"]}
    loras = {l["name"]: parse_size(l["bytes"], f"trace loras[{l['name']}].bytes") for l in trace.get("loras", [])}
    first_policy = sim_json["runs"][0]["policy"]
    runs = [r for r in sim_json["runs"] if r["policy"] == first_policy]
    accesses: Dict[Tuple[int, int], List[list]] = {}
    incomplete = f"pins-sim's access dump {dump_path!r} is incomplete (a full disk?)"
    try:
        with open(dump_path) as f:
            for line in f:
                try:
                    a = json.loads(line)
                except json.JSONDecodeError:
                    discard(dump_path)
                    raise DemoError(f"{incomplete}: a line is cut short") from None
                accesses.setdefault((a["run"], a["step"]), []).append(
                    [a["key"], a["bytes"], a["kind"], bool(a["resident"]), a.get("signature")])
    except OSError as e:
        raise files.failed(f"cannot read pins-sim's access dump {dump_path!r}", e) from None
    # pins-sim does not report a dump it could not write whole; each access is a
    # pin hit or miss, so the counts tell.
    for r in runs:
        dumped = sum(len(v) for (run, _), v in accesses.items() if run == r["run"])
        if dumped != r["pin_hits"] + r["pin_misses"]:
            discard(dump_path)
            raise DemoError(f"{incomplete}: run {r['run']} has {dumped} accesses in it, pins-sim counted "
                            f"{r['pin_hits'] + r['pin_misses']}")
    plan = []
    for r in runs:
        p = prompts[r["prompt"]]
        models: List[str] = []
        used_loras = set()
        steps = []
        for i, s in enumerate(p["steps"], start=1):
            if s["model"] not in models:
                models.append(s["model"])
            used_loras.update(s.get("loras", []))
            steps.append({"model": s["model"], "accesses": accesses.get((r["run"], i), [])})
        plan.append({"run": r["run"], "prompt": r["prompt"], "models": models, "steps": steps,
                     "lora_bytes": sum(loras[l] for l in used_loras)})
    return plan


# --- the synthetic files -------------------------------------------------------------

def synthetic_layout(plan: List[dict]) -> Tuple[Dict[str, Dict[str, int]], Dict[str, Dict[str, int]]]:
    """{model: {layer: bytes}} and {lora: {model/layer: bytes}} of every access, in first-use order."""
    models: Dict[str, Dict[str, int]] = {}
    loras: Dict[str, Dict[str, int]] = {}
    for r in plan:
        for s in r["steps"]:
            for key, nbytes, kind, _, _ in s["accesses"]:
                if kind == "patches":
                    lora, _, rest = key[len("lora:"):].partition("/")
                    loras.setdefault(lora, {}).setdefault(rest, nbytes)
                else:
                    model, _, layer = key.partition("/")
                    models.setdefault(model, {}).setdefault(layer, nbytes)
    return models, loras


def write_synthetic(path: str, tensors: Dict[str, int], trace_name: str, seed: int) -> str:
    """A safetensors file of random fp16 weights in [-1, 1) (uint8 for an odd
    size); returns the digest of its bytes."""
    import numpy as np
    rng = np.random.default_rng(seed)
    specs = [(name,) + files.synthetic_shape(n) for name, n in tensors.items()]

    def fill(i: int, nbytes: int, f) -> None:
        done = 0
        while done < nbytes:
            n = min(64 << 20, nbytes - done)
            if n % 2 == 0:  # fp16 bit patterns below 1.0 (0x3c00), either sign: no NaN, no infinity
                bits = rng.integers(0, 0x3C00, n // 2, dtype=np.uint16)
                bits |= (rng.integers(0, 2, n // 2, dtype=np.uint16) << 15)
                f.write(bits.tobytes())
            else:
                f.write(rng.bytes(n))
            done += n
    return files.write_file(path, specs, {"pins_demo_trace": trace_name, "format": "pt"}, fill)


def synthetic_seed(trace_name: str, name: str) -> int:
    """The seed of the synthetic file `name` (relative to the models directory):
    the same file is written with the same bytes, whichever others are written with it."""
    return int.from_bytes(hashlib.sha256(f"{trace_name}\0{name}".encode()).digest()[:8], "little")


def shard_name(layer: str) -> str:
    return layer.replace(os.sep, "_") + ".safetensors"


def ensure_files(models_dir: str, layout: Dict[str, Dict[str, int]], loras: Dict[str, Dict[str, int]],
                 user_files: Dict[str, str], trace_name: str, progress) -> Dict[str, str]:
    """Writes the synthetic files the trace needs where they are missing, stale
    or no longer what the demo wrote (a directory per model, a file per layer:
    Note [Demo files]; Note [Demo digests]); returns {lora: path}. The user's
    files (--files) are theirs: neither checked nor written."""
    wanted: List[Tuple[str, Dict[str, int]]] = []
    for model, layers in layout.items():
        if model in user_files:
            continue
        make_dir(os.path.join(models_dir, model), "model directory")
        wanted += [(os.path.join(models_dir, model, shard_name(layer)), {f"{layer}.weight": n})
                   for layer, n in layers.items()]
    lora_paths = {lora: os.path.join(models_dir, f"lora_{lora}.safetensors") for lora in loras}
    wanted += [(lora_paths[lora], dict(tensors)) for lora, tensors in loras.items()]

    digests = files.Digests(models_dir)
    todo, unproven = [], []
    for path, tensors in wanted:
        try:
            why = files.check_synthetic(path, tensors, trace_name) or digests.recorded(path)
            if not why and not digests.proven(path):
                unproven.append((path, tensors))
        except OSError as e:
            raise files.failed(f"cannot check model file {path!r}", e) from None
        if why:
            todo.append((path, tensors, why))
    if unproven:
        progress(f"checking {len(unproven)} files ({gib(sum(sum(t.values()) for _, t in unproven))} GiB) against "
                 f"their digests in {digests.path} (written or changed since their last check)")
        for path, tensors in unproven:
            try:
                why = digests.verify(path)
            except OSError as e:
                raise files.failed(f"cannot check model file {path!r}", e) from None
            if why:
                progress(f"  {path}: {why}: writing it again")
                todo.append((path, tensors, why))
        digests.save()
    if todo:
        total = sum(sum(t[1].values()) for t in todo)
        progress(f"writing {len(todo)} safetensors files ({gib(total)} GiB) to {models_dir} "
                 f"({todo[0][2]}{', ...' if len(todo) > 1 else ''})")
        t0 = time.perf_counter()
        for path, tensors, _ in todo:
            try:
                digests.record(path, write_synthetic(path, tensors, trace_name,
                                                     synthetic_seed(trace_name, os.path.relpath(path, models_dir))))
            except OSError as e:
                raise files.failed(f"cannot write model file {path!r}", e) from None
            digests.save()  # after each file: what a later failure leaves written stays recorded
        progress(f"  written in {time.perf_counter() - t0:.1f} s")
    return lora_paths


# --- checks of the environment --------------------------------------------------------

def disk_accounting_works(directory: str) -> Tuple[bool, str]:
    """Whether /proc/self/io read_bytes counts a read of a file dropped from the
    page cache here (it does not under some containers and file systems)."""
    if read_bytes() is None:
        return False, "/proc/self/io has no read_bytes here"
    try:
        fd, path = tempfile.mkstemp(prefix=".io-probe-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(4 << 20))
                f.flush()
                os.fsync(f.fileno())
            files.drop_from_page_cache(path)
            before = read_bytes()
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
            moved = read_bytes() - before
        finally:
            os.unlink(path)
    except OSError as e:
        raise files.failed(f"cannot write and read a 4 MiB probe file in {directory!r}", e) from None
    if moved < (4 << 20) * 0.9:
        return False, (f"reading a 4 MiB file dropped from the page cache moved /proc/self/io read_bytes by "
                       f"{moved} bytes: the kernel does not account this file system's reads here")
    return True, "read_bytes counted a 4 MiB read of a file dropped from the page cache"


# --- one policy in its own process ------------------------------------------------------

class Progress:
    """A bar on standard error: redrawn in place on a terminal, a line per run otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def line(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def bar(self, label: str, fraction: float, note: str) -> None:
        if not self.tty:
            return
        width = 30
        full = int(round(width * min(max(fraction, 0.0), 1.0)))
        self.stream.write(f"\r\033[K{label} [{'#' * full}{'.' * (width - full)}] {100 * fraction:3.0f}% {note}")
        self.stream.flush()


def replay_policy(policy: str, spec: dict, out_dir: str, progress: Progress, nruns: int, conf: str) -> dict:
    spec = dict(spec, policy=policy, result=os.path.join(out_dir, f"replay_{policy}.json"))
    spec_path = os.path.join(out_dir, f"replay_{policy}.spec.json")
    env = dict(os.environ)
    backend = "cuda" if spec["device"].startswith("cuda") else "cpu"
    root = os.path.join(out_dir, f"replay_{policy}_system")
    spec["system_root"] = root
    # As pins-sim sets up its balancer: the trace's headroom, then --conf; its pool keeps no idle memory,
    # and no monitor relieves between node boundaries: pins-sim models one checking after every cast, which
    # changes nothing on this trace (Note [Pressure from others]), but its polls against a meminfo rewritten
    # after every call would make the replay depend on timing. pin_reserve, unless --conf sets it, pins derives from the modelled meminfo, as
    # pins-sim does from the trace's RAM. A memory reading stands for DEMO_READING_AGE_US (Note [Demo machine]).
    # No prewarm (Note [Prewarm]), as in pins-sim, which has no thread: its commits, at its thread's pace,
    # would move the modelled page cache and make a run unrepeatable (--conf prewarm:true turns it on).
    env["PINS_CONF"] = ",".join(filter(None, [f"backend:{backend}", "retain_free:0", "monitor:false",
                                              f"memory_max_age_us:{DEMO_READING_AGE_US}", f"system_root:{root}",
                                              f"policy:{policy if policy != 'none' else 'mru'}",
                                              f"headroom:{spec['machine']['headroom']}", "prewarm:false", conf]))
    save(spec_path, f"the {policy} replay's spec", json_bytes(spec))
    cmd = [sys.executable, REPLAY, spec_path]
    label = f"{policy:>5}"
    err_path = os.path.join(out_dir, f"replay_{policy}.stderr")
    try:
        with open(err_path, "w") as err_file:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, text=True, env=env)
            _follow(p, label, progress, nruns)
        with open(err_path) as f:
            err = f.read()
    except OSError as e:
        raise files.failed(f"cannot write or read the {policy} replay's log {err_path!r}", e) from None
    if p.returncode == FILE_ERROR:
        said = [line for line in err.splitlines() if line.startswith(FILE_ERROR_PREFIX)]
        if said:
            raise files.FileError(f"the {policy} replay: {said[-1][len(FILE_ERROR_PREFIX):]}")
    if p.returncode != 0:
        raise RuntimeError(f"the {policy} replay failed (exit status {p.returncode}; {err_path}):\n{err.strip()}")
    try:
        with open(spec["result"]) as f:
            return json.load(f)
    except OSError as e:
        raise files.failed(f"cannot read the {policy} replay's result {spec['result']!r}", e) from None


def _follow(p: subprocess.Popen, label: str, progress: Progress, nruns: int) -> None:
    """Shows a replay's progress events until it exits."""
    for line in p.stdout:
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev["ev"] == "ready":
            note = ""
            if ev["cached_after_drop"]:
                note = f" ({gib(ev['cached_after_drop'])} GiB of the files stayed in the page cache)"
            progress.line(f"{label}: files loaded and dropped from the page cache in {ev['setup_s']:.1f} s{note}")
        elif ev["ev"] == "progress":
            progress.bar(f"{label} run {ev['run']}/{nruns}", ev["done"] / max(ev["total"], 1),
                         f"{gib(ev['done'])}/{gib(ev['total'])} GiB copied")
        elif ev["ev"] == "run":
            disk = "n/a" if ev["disk_bytes"] is None else f"{gib(ev['disk_bytes'])} GiB"
            progress.line(f"{label} run {ev['run']}/{nruns} {ev['prompt']:<14} {ev['wall_s']:6.2f} s, disk {disk}, "
                          f"{ev['hits']} hits, {ev['misses']} misses")
    p.wait()


# --- the report ----------------------------------------------------------------------------

def explain(m: dict, p: dict, largest: int) -> Optional[str]:
    """Why a run's measured disk bytes differ from the prediction, when they do by
    more than 5% and more than one largest layer; None otherwise."""
    got, want = m["disk_bytes"], p["disk_bytes"]
    if got is None or abs(got - want) <= max(0.05 * want, largest):
        return None
    parts = []
    kernel_extra = got - m["model_disk_bytes"]
    if abs(kernel_extra) > largest / 4:
        parts.append(f"the kernel read {gib(kernel_extra)} GiB beyond the layers the page cache lacked "
                     "(read-ahead past a layer's end, the files' headers)")
    if m["hits"] != p["pin_hits"] or m.get("evicted_bytes") != p.get("evicted_bytes"):
        parts.append(f"the balancer served {m['hits']} casts from pins and evicted {gib(m.get('evicted_bytes'))} "
                     f"GiB, the simulated one {p['pin_hits']} and {gib(p.get('evicted_bytes'))} GiB: the real "
                     "balancer and the simulated one (the same code, on the demo's meminfo and on the simulator's "
                     "model of memory) evicted different pins")
    pc_diff = m["page_cache_hit_bytes"] - p.get("page_cache_hit_bytes", 0)
    if abs(pc_diff) > largest / 4:
        parts.append(f"the page cache served {gib(m['page_cache_hit_bytes'])} GiB (simulator: "
                     f"{gib(p.get('page_cache_hit_bytes', 0))})")
    if m.get("early_read_bytes"):
        parts.append(f"{gib(m['early_read_bytes'])} GiB were read from the page cache just before their pin's "
                     "commit would have evicted them on the modelled machine")
    return "; ".join(parts) or "no single cause found in the counters"


def table(policies: List[str], measured: Dict[str, dict], predicted: Dict[str, List[dict]]) -> List[str]:
    runs = measured[policies[0]]["runs"]
    big = max(q["disk_bytes"] for p in policies for q in predicted[p]) >= 2**30
    unit, scale = ("GiB", 2**30) if big else ("MiB", 2**20)

    def fmt(n: Optional[int]) -> str:
        return "n/a" if n is None else f"{n / scale:.2f}" if big else f"{n / scale:.1f}"
    lines = [f"{unit} read from disk per run: measured (pins-sim's prediction)", ""]
    head = f"{'run':>3}  {'prompt':<14}" + "".join(f"{p:>17}" for p in policies)
    lines += [head, "-" * len(head)]
    for i, r in enumerate(runs):
        row = f"{r['run']:>3}  {r['prompt']:<14}"
        for p in policies:
            m = measured[p]["runs"][i]
            row += f"{fmt(m['disk_bytes']):>9} ({fmt(predicted[p][i]['disk_bytes']):>5})"
        lines.append(row)
    lines += ["", f"{'policy':<7}{unit + ' read':>10}{'predicted':>11}{'wall s':>9}{'hits':>7}{'misses':>8}"
                  f"{'peak RSS GiB':>14}"]
    for p in policies:
        rs = measured[p]["runs"]
        disk = None if any(r["disk_bytes"] is None for r in rs) else sum(r["disk_bytes"] for r in rs)
        lines.append(f"{p:<7}{fmt(disk):>10}{fmt(sum(x['disk_bytes'] for x in predicted[p])):>11}"
                     f"{sum(r['wall_s'] for r in rs):>9.1f}{sum(r['hits'] for r in rs):>7}"
                     f"{sum(r['misses'] for r in rs):>8}{gib(max(r['peak_rss_bytes'] for r in rs)):>14}")
    return lines


def plot(report: dict, f) -> None:
    """The PNG of the report, written to binary file `f`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(report["policies"])
    runs = report["policies"][policies[0]]["runs"]
    labels = [f"{r['run']}\n{r['prompt']}" for r in runs]
    x = list(range(len(runs)))
    width = 0.8 / len(policies)
    colors = {"none": "#7f7f7f", "lru": "#d62728", "mru": "#1f77b4", "trace": "#2ca02c", "reuse": "#9467bd"}
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    for k, p in enumerate(policies):
        rs = report["policies"][p]["runs"]
        xs = [i - 0.4 + width * (k + 0.5) for i in x]
        ax1.bar(xs, [(r["disk_bytes"] or 0) / 2**30 for r in rs], width, color=colors.get(p), label=p)
        ax1.scatter(xs, [r["predicted_disk_bytes"] / 2**30 for r in rs], marker="_", s=120, color="black",
                    zorder=3, label="pins-sim's prediction" if k == 0 else None)
        ax2.bar(xs, [r["wall_s"] for r in rs], width, color=colors.get(p), label=p)
    ax1.set_ylabel("read from disk (GiB)")
    ax1.set_ylim(0, 1.2 * max([(r["disk_bytes"] or 0) / 2**30 for p in policies for r in report["policies"][p]["runs"]]
                              + [r["predicted_disk_bytes"] / 2**30 for p in policies
                                 for r in report["policies"][p]["runs"]]))
    ax1.legend(ncol=5, fontsize=8, loc="upper right")
    ax1.set_title(report["title"], fontsize=10)
    ax2.set_ylabel("wall time (s)")
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, fontsize=8)
    ax2.set_xlabel("run and prompt")
    for ax in (ax1, ax2):
        ax.grid(axis="y", alpha=0.3)
    fig.text(0.01, 0.005, report["machine_text"], fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    try:
        fig.savefig(f, format="png", dpi=100)
    finally:
        plt.close(fig)


# --- the command -------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="profiling/demo/demo.py",
        description="Replays a workflow trace through pins on real safetensors files, per policy and without pins, "
                    "and compares the measured disk reads with pins-sim's prediction for the same machine. Exit "
                    "status 0 when it ran; 2 for a bad option, file or trace, or a file or directory it cannot "
                    "read or write (one line that names it); 1 when a replay failed otherwise.")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help=f"the workflow, in pins-sim's trace format (default: {DEFAULT_TRACE} of the checkout)")
    p.add_argument("--sequence", default=None, metavar="NAME", help="the trace's sequence to replay (default: its first)")
    p.add_argument("--runs", default=None, metavar="N", help="runs to replay (default: the sequence's)")
    p.add_argument("--policy", default=",".join(DEFAULT_POLICIES), metavar="LIST",
                   help="comma-separated from none (no pins), lru, mru, trace, reuse; default all but reuse")
    p.add_argument("--files", default=None, metavar="MODEL=PATH,...",
                   help="your own safetensors files for models of the trace; their layers replace the trace's. "
                        "Models not named get synthetic files in --models-dir")
    p.add_argument("--models-dir", default=None, metavar="DIR",
                   help="where the synthetic model files are written on the first run and reused after "
                        "(default: OUT/models)")
    p.add_argument("--ram-budget", default=None, metavar="SIZE",
                   help="RAM of the modelled machine, shared by pins and the page cache besides the trace's "
                        "other_ram (default: the trace's machine.ram)")
    p.add_argument("--vram", default=None, metavar="SIZE", help="device memory (default: the trace's machine.vram)")
    p.add_argument("--conf", default=None, metavar="TEXT",
                   help="balancer settings in PINS_CONF syntax, for the replays and pins-sim alike (default: "
                        f"{DEFAULT_TRACE_CONF} with the default trace, none otherwise)")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="cpu, cuda or cuda:N; auto (default): cuda when a GPU is present, else cpu with the device "
                        "memory emulated in host RAM")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"where report.json, demo.png and the replays' files go (default: {DEFAULT_OUT} of the "
                        "checkout)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return p


def _positive_int(text: str, what: str) -> int:
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise DemoError(f"{what}: expected a positive integer, got {text!r}") from None
    if n < 1:
        raise DemoError(f"{what}: expected a positive integer, got {text!r}")
    return n


def _conf_value(conf: str, key: str) -> Optional[str]:
    value = None
    for item in filter(None, (s.strip() for s in conf.split(","))):
        k, _, v = item.partition(":")
        if k.strip() == key:
            value = v.strip()
    return value


class Options(NamedTuple):
    """The options checked before the trace is read; those that depend on the
    trace (--ram-budget, --vram, --files, --device) are checked with it."""
    trace_path: str
    out: str
    models_dir: str
    policies: List[str]
    sequence: Optional[str]
    runs: Optional[int]
    conf: str
    pin_reserve: Optional[int]  # --conf's; None: what pins derives from the modelled RAM
    plot: bool


def check_options(args: argparse.Namespace) -> Options:
    default_trace = args.trace is None
    out = os.path.abspath(args.out or os.path.join(_CHECKOUT, DEFAULT_OUT))
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            raise DemoError(f"--policy: unknown policy {p!r} (choose from {', '.join(POLICIES)})")
    if not policies or len(set(policies)) != len(policies):
        raise DemoError(f"--policy: expected distinct policies from {', '.join(POLICIES)}, got {args.policy!r}")
    runs = _positive_int(args.runs, "--runs") if args.runs is not None else None
    conf = args.conf if args.conf is not None else (DEFAULT_TRACE_CONF if default_trace else "")
    for key in ("backend", "policy", "retain_free", "memory_max_age_us", "system_root"):
        if _conf_value(conf, key) is not None:
            raise DemoError(f"--conf: key {key!r} is set by the demo itself (per replay), got {conf!r}")
    pin_reserve_text = _conf_value(conf, "pin_reserve")
    pin_reserve = parse_size(pin_reserve_text, "--conf pin_reserve") if pin_reserve_text else None
    return Options(trace_path=os.path.abspath(args.trace or os.path.join(_CHECKOUT, DEFAULT_TRACE)), out=out,
                   models_dir=os.path.abspath(args.models_dir or os.path.join(out, "models")), policies=policies,
                   sequence=args.sequence, runs=runs, conf=conf, pin_reserve=pin_reserve, plot=not args.no_plot)


def derived_headroom(ram: int) -> int:
    """The headroom pins derives from `ram` bytes of RAM (Note [Derived budget] in
    csrc/config/config.h), which pins-sim gives a machine that sets none."""
    mib = 1 << 20
    return min(max(ram // 16, 1 << 30), 4 << 30, ram // 4) // mib * mib


def modelled_machine(trace: dict, trace_path: str, args: argparse.Namespace) -> Dict[str, int]:
    """The trace's machine (ram, vram, headroom, other_ram), with --ram-budget and --vram applied."""
    machine = trace.get("machine") or {}
    mach = {}
    for key in ("ram", "vram", "headroom", "other_ram"):
        if key not in machine and key in ("ram", "vram"):
            raise DemoError(f"--trace {trace_path!r}: machine.{key} is missing")
        if key == "headroom" and key not in machine:
            continue  # derived from the RAM below, as pins-sim does
        mach[key] = parse_size(machine.get(key, {"other_ram": 4 << 30}.get(key, 0)), f"--trace machine.{key}")
    if args.ram_budget is not None:
        mach["ram"] = parse_size(args.ram_budget, "--ram-budget")
    if "headroom" not in machine:
        mach["headroom"] = derived_headroom(mach["ram"])  # of the RAM --ram-budget set, as pins-sim's --machine
    if args.ram_budget is not None and mach["ram"] <= mach["other_ram"] + mach["headroom"]:
        raise DemoError(f"--ram-budget: {args.ram_budget!r} leaves nothing for pins: the trace's other_ram "
                        f"({gib(mach['other_ram'])} GiB) and headroom ({gib(mach['headroom'])} GiB) take it all")
    if args.vram is not None:
        mach["vram"] = parse_size(args.vram, "--vram")
        if mach["vram"] == 0:
            raise DemoError("--vram: must be positive, got 0")
    return mach


def simulated_trace(trace: dict, opts: Options, user_files: Dict[str, str]
                    ) -> Tuple[str, Dict[str, Dict[str, List[List[str]]]]]:
    """The trace file pins-sim replays (the given one, or with --files the one
    derived from the user's files) and {model: {layer: [[file, tensor], ...]}}
    of those files."""
    if not user_files:
        return opts.trace_path, {}
    path = os.path.join(opts.out, "trace.json")
    return path, derive_trace(trace, user_files, path)


def choose_device(text: str, mach: Dict[str, int]):
    """The torch device of --device, checked against the modelled device memory."""
    import torch
    device = text
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DemoError(f"--device: expected cpu, cuda, cuda:N or auto, got {text!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise DemoError(f"--device: expected cpu, cuda, cuda:N or auto, got {text!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DemoError(f"--device: {text!r} asked for, but torch sees no CUDA device here")
        free, _ = torch.cuda.mem_get_info(dev)
        if mach["vram"] > free:
            raise DemoError(f"--vram: the modelled device memory ({gib(mach['vram'])} GiB) exceeds what is free on "
                            f"{dev} ({gib(free)} GiB)")
    return dev


def device_conf(conf: str, dev) -> str:
    """The balancer settings of the replays and of pins-sim on device `dev`."""
    if dev.type != "cpu":
        return conf
    # The CPU backend page-locks nothing (no mlock), so the pin ceiling, which
    # drops page-locks and gives idle extents back to make lock room, never
    # acts; pins-sim's null backend counts every pin as locked, so the
    # prediction is made with the ceiling at all of RAM too.
    return ",".join(filter(None, [conf, "ceiling_max:1,ceiling_min:1"]))


def predict(sim_trace: str, mach: Dict[str, int], opts: Options, conf: str) -> Tuple[dict, Dict[str, List[dict]], str]:
    """pins-sim on the same trace and the same machine: its JSON report for the
    pins policies, each policy's predicted runs, and the path of its access dump."""
    sim = find_sim()
    sim_args = ["--machine", f"ram={mach['ram']}", "--machine", f"vram={mach['vram']}"]
    if opts.sequence:
        sim_args += ["--sequence", opts.sequence]
    if opts.runs:
        sim_args += ["--runs", str(opts.runs)]
    dump = os.path.join(opts.out, "accesses.jsonl")
    sim_policies = [p for p in opts.policies if p != "none"] or ["lru"]
    try:
        predicted_json = run_sim(sim, sim_trace, sim_args + ["--policy", ",".join(sim_policies), "--dump-accesses",
                                                             dump] + (["--conf", conf] if conf else []))
    except DemoError:
        discard(dump)  # what pins-sim wrote of it before it failed
        raise
    predicted: Dict[str, List[dict]] = {p: [r for r in predicted_json["runs"] if r["policy"] == p]
                                        for p in sim_policies}
    if "none" in opts.policies:
        # Without pins: lru that never gets a pin, so every copy reads the page cache.
        none_json = run_sim(sim, sim_trace, sim_args + ["--policy", "lru", "--conf",
                                                        ",".join(filter(None, [conf, "pin_reserve:256T"]))])
        predicted["none"] = none_json["runs"]
    return predicted_json, predicted, dump


def replay_spec(opts: Options, dev, mach: Dict[str, int], trace: dict, plan: List[dict],
                layout: Dict[str, Dict[str, int]], lora_layout: Dict[str, Dict[str, int]], lora_paths: Dict[str, str],
                user_files: Dict[str, str], layer_tensors: Dict[str, Dict[str, List[List[str]]]]) -> dict:
    """What every policy's replay process reads (replay.py): the files of each
    layer, the LoRAs, the machine and the runs to replay."""
    spec_models = {}
    for model, layers in layout.items():
        if model in user_files:
            spec_models[model] = {"what": f"--files {model}=", "layers": {l: layer_tensors[model][l] for l in layers}}
        else:
            spec_models[model] = {"what": "file", "layers": {
                l: [[os.path.join(opts.models_dir, model, shard_name(l)), f"{l}.weight"]] for l in layers}}
    return {"device": str(dev), "reading_age_us": DEMO_READING_AGE_US, "machine": mach,
            "pin_reserve": opts.pin_reserve if opts.pin_reserve is not None else derived_headroom(mach["ram"]) // 2,
            "models": spec_models,
            "model_order": [m["name"] for m in trace["models"]],
            "loras": {l: {"file": lora_paths.get(l), "tensors": t} for l, t in lora_layout.items()}, "runs": plan}


def describe_machine(mach: Dict[str, int], dev) -> str:
    """The modelled machine and the one the demo ran on, in one line."""
    import torch
    return (f"modelled machine: RAM {gib(mach['ram'])} GiB (other {gib(mach['other_ram'])}, headroom "
            f"{gib(mach['headroom'])}), device memory {gib(mach['vram'])} GiB "
            + ("emulated in host RAM (no GPU)" if dev.type == "cpu" else f"on {torch.cuda.get_device_name(dev)}")
            + f"; ran on {os.cpu_count()} CPUs, {gib(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))} "
            "GiB RAM")


def build_report(sim_trace: str, predicted_json: dict, mach: Dict[str, int], machine_text: str, dev, conf: str,
                 disk_check: Tuple[bool, str], measured: Dict[str, dict], predicted: Dict[str, List[dict]]
                 ) -> Tuple[dict, List[str]]:
    """report.json's content, each measured run beside its prediction, and a line
    for each run whose disk bytes differ from it (explain)."""
    ok, why = disk_check
    largest = predicted_json.get("largest_layer_bytes", 0)
    report = {"title": predicted_json["trace"], "trace": sim_trace,
              "sequence": predicted_json["sequence"], "machine": mach, "machine_text": machine_text,
              "device": str(dev), "conf": conf, "disk_accounting": {"works": ok, "check": why},
              "largest_layer_bytes": largest, "policies": {}}
    explanations = []
    for p, policy_measured in measured.items():
        rows = []
        for m, q in zip(policy_measured["runs"], predicted[p]):
            row = dict(m)
            row["predicted_disk_bytes"] = q["disk_bytes"]
            row["predicted_hits"] = q["pin_hits"]
            row["predicted_misses"] = q["pin_misses"]
            row["predicted_page_cache_hit_bytes"] = q.get("page_cache_hit_bytes")
            why_diff = explain(m, q, largest)
            if why_diff:
                row["difference"] = why_diff
                explanations.append(f"{p} run {m['run']}: measured {gib(m['disk_bytes'])} GiB, predicted "
                                    f"{gib(q['disk_bytes'])}: {why_diff}")
            rows.append(row)
        report["policies"][p] = {k: v for k, v in policy_measured.items() if k != "runs"}
        report["policies"][p]["runs"] = rows
    return report, explanations


def write_report(report: dict, out: str, with_plot: bool) -> Tuple[str, Optional[str]]:
    """report.json and (unless --no-plot) demo.png in `out`: their paths, None for no plot."""
    report_path = os.path.join(out, "report.json")
    save(report_path, "the report", json_bytes(report, indent=1))
    if not with_plot:
        return report_path, None
    plot_path = os.path.join(out, "demo.png")
    save(plot_path, "the plot", lambda f: plot(report, f))
    return report_path, plot_path


def print_summary(policies: List[str], measured: Dict[str, dict], predicted: Dict[str, List[dict]],
                  explanations: List[str], machine_text: str, report_path: str, plot_path: Optional[str]) -> None:
    """The table, the differences, the machine and the RESULT line, on standard output."""
    print()
    for line in table(policies, measured, predicted):
        print(line)
    print()
    if explanations:
        print("differences beyond 5% and one largest layer:")
        for e in explanations:
            print(f"  {e}")
    else:
        print("every measured run is within 5% (or one largest layer) of pins-sim's prediction")
    print(machine_text)
    print(f"RESULT report={report_path} plot={plot_path or 'none'}")


def run(args: argparse.Namespace) -> int:
    progress = Progress()
    opts = check_options(args)
    trace = load_trace(opts.trace_path)
    mach = modelled_machine(trace, opts.trace_path, args)
    writable_dir(opts.out, "--out")
    user_files = parse_files_option(args.files, trace) if args.files is not None else {}
    sim_trace, layer_tensors = simulated_trace(trace, opts, user_files)
    dev = choose_device(args.device, mach)
    conf = device_conf(opts.conf, dev)
    predicted_json, predicted, dump = predict(sim_trace, mach, opts, conf)

    plan = plan_runs(trace, predicted_json, dump)
    layout, lora_layout = synthetic_layout(plan)
    writable_dir(opts.models_dir, "--models-dir" if args.models_dir is not None else "models directory")
    lora_paths = ensure_files(opts.models_dir, layout, lora_layout, user_files, trace.get("name", ""), progress.line)
    disk_ok, disk_why = disk_accounting_works(opts.models_dir)
    if not disk_ok:
        progress.line(f"warning: disk bytes cannot be measured here: {disk_why}; they are reported as null")
    spec = replay_spec(opts, dev, mach, trace, plan, layout, lora_layout, lora_paths, user_files, layer_tensors)

    machine_text = describe_machine(mach, dev)
    progress.line(f"trace: {predicted_json['trace']} ({os.path.relpath(sim_trace)}), sequence "
                  f"{predicted_json['sequence']}, {len(plan)} runs")
    progress.line(machine_text)
    if dev.type == "cpu":
        progress.line("no GPU: device memory is emulated in host RAM, copies are RAM copies")
    measured = {p: replay_policy(p, spec, opts.out, progress, len(plan), conf) for p in opts.policies}

    report, explanations = build_report(sim_trace, predicted_json, mach, machine_text, dev, conf,
                                        (disk_ok, disk_why), measured, predicted)
    report_path, plot_path = write_report(report, opts.out, opts.plot)
    print_summary(opts.policies, measured, predicted, explanations, machine_text, report_path, plot_path)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except (DemoError, files.FileError) as e:
        print(f"demo: {e}", file=sys.stderr)
        return USAGE_ERROR
    except OSError as e:  # one the demo did not expect where it met it: still named, still no traceback
        print(f"demo: {files.failed(None, e)}", file=sys.stderr)
        return USAGE_ERROR
    except RuntimeError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
