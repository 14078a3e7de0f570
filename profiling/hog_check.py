"""Memory pressure from another process, at pins' default budget: a check run by
hand, never in CI (CI shares its machine; docs/RELIABILITY.md "Memory pressure
from another process").

A pins process pins a large part of RAM (one model, then the prompt ends, so its
pins are what a pressure check frees first); then a hog process allocates and
touches RAM in 64 MiB chunks until available RAM is near zero. Available RAM is
sampled every millisecond or two throughout. It reports:

- whether either process was OOM-killed (its exit status, /proc/vmstat
  oom_kill, and the cgroup's OOM count);
- every episode of available RAM below pins' headroom while the hog ran, and
  how long each lasted against one monitor period (monitor_interval_ms);
- what pins held before and after, what its pressure checks freed.

The hog stops allocating whenever available RAM is below --floor (256 MiB in
the cgroup, 1 GiB with --machine) and waits for it to come back, giving up
after --give-up seconds; it never takes the machine past that floor (other
processes' bursts aside). Its oom_score_adj is 1000: were the kernel to kill
anything, the hog goes first.

By default both processes run in a memory cgroup of their own, limited to
--limit (8 GiB): pins reads the limit as its RAM (Note [Derived budget]),
"available" is the cgroup's (limit - usage + inactive file cache, as pins
computes it, csrc/system/sysmem.h), and the rest of the machine keeps its
memory. --machine runs them in this process's cgroup instead, against the whole
machine's MemAvailable (the hog then takes most of the machine's RAM for a few
seconds). --no-monitor runs pins with monitor:false: what happens without the
monitor. Needs root (or a writable memory cgroup) for the cgroup mode, and the
torch_pins of this checkout (python_bindings, built: make build).

    .venv/bin/python profiling/hog_check.py [--machine] [--limit 8G] [--pins 5G] [--no-monitor]

The monitor checks every monitor_interval_ms (200 ms), 20 ms after a check
that found pressure, and sooner while available RAM falls fast towards the
headroom (Note [Pressure monitor wake-ups]), so its first check in an episode
comes within one period (within about 25 ms on the 2-core VM of
docs/RELIABILITY.md); available RAM is back above the headroom once the relief
has freed pins (a few ms here). It prints which torch_pins and libpins.so the
pins process loaded: a venv's editable install may resolve another checkout's.
Exit status: 0 when neither process was killed and, with the monitor, the
first check of every episode came within one monitor period (plus --grace-ms,
50 ms, for the scheduling of a loaded machine) and the hog never found
available RAM below its floor (pins gave way first); without the monitor the
check reports and exits 0 unless a process was killed; 1 otherwise; 2 for a
usage error or a machine where it cannot run.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)
MiB = 1 << 20
GiB = 1 << 30
CHUNK = 64 * MiB


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": MiB, "G": GiB, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in units else ""
    return int(float(t[: len(t) - len(unit)]) * units[unit])


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


# --- memory as pins reads it (csrc/system/sysmem_linux.cpp) ---

def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            out[key] = int(rest.split()[0]) * 1024
    return out


class Cgroup:
    """A memory cgroup of this check's own, under this process's (v1 or v2)."""

    def __init__(self, limit: int):
        self.v2 = not os.path.isdir("/sys/fs/cgroup/memory")
        path = None
        with open("/proc/self/cgroup") as f:
            for line in f:
                ident, controllers, where = line.rstrip("\n").split(":", 2)
                if (self.v2 and ident == "0") or (not self.v2 and "memory" in controllers.split(",")):
                    path = where
        if path is None:
            raise SystemExit("hog_check: no memory cgroup in /proc/self/cgroup; run with --machine")
        base = "/sys/fs/cgroup" if self.v2 else "/sys/fs/cgroup/memory"
        self.dir = os.path.join(base + path, f"pins-hog-check-{os.getpid()}")
        try:
            os.mkdir(self.dir)
            self._write("memory.max" if self.v2 else "memory.limit_in_bytes", str(limit))
        except OSError as e:
            self.remove()
            raise SystemExit(f"hog_check: cannot make a memory cgroup at {self.dir} ({e}); run with --machine")
        self.limit = limit
        self.oom_kills_at_start = self.oom_kills()

    def _write(self, name: str, text: str) -> None:
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def _read(self, name: str) -> str:
        with open(os.path.join(self.dir, name)) as f:
            return f.read()

    def enter(self) -> None:
        """Moves the calling process into the cgroup (a child's preexec_fn)."""
        self._write("cgroup.procs", str(os.getpid()))

    def available(self) -> int:
        usage = int(self._read("memory.current" if self.v2 else "memory.usage_in_bytes"))
        inactive = 0
        key = "inactive_file" if self.v2 else "total_inactive_file"
        for line in self._read("memory.stat").splitlines():
            k, v = line.split()
            if k == key:
                inactive = int(v)
        return max(0, self.limit - max(0, usage - inactive))

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in self._read(name).splitlines():
            k, v = line.split()
            if k == "oom_kill":
                return int(v)
        return 0

    def remove(self) -> None:
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def vmstat_oom_kills() -> int:
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k == "oom_kill":
                return int(v)
    return 0


def available_fn(cgroup_dir: Optional[str], limit: int):
    """Available RAM as pins computes it: MemAvailable, bounded in a cgroup by its
    limit less its usage, where the inactive file cache counts as available."""
    if cgroup_dir is None:
        return lambda: meminfo()["MemAvailable"]
    v2 = os.path.exists(os.path.join(cgroup_dir, "memory.current"))
    usage_file = os.path.join(cgroup_dir, "memory.current" if v2 else "memory.usage_in_bytes")
    stat_file = os.path.join(cgroup_dir, "memory.stat")
    key = "inactive_file" if v2 else "total_inactive_file"

    def available() -> int:
        with open(usage_file) as f:
            usage = int(f.read())
        inactive = 0
        with open(stat_file) as f:
            for line in f:
                k, v = line.split()
                if k == key:
                    inactive = int(v)
                    break
        return min(meminfo()["MemAvailable"], max(0, limit - max(0, usage - inactive)))
    return available


# --- the two processes ---

def role_pins(args: argparse.Namespace) -> int:
    """Pins `args.pins` bytes (64 MiB pins of views of one source), ends the
    prompt, says "ready", waits for a line on stdin, then prints its counters."""
    import torch

    import torch_pins as pins

    conf, sources = pins.config(), pins.config_sources()
    model = pins.register_model("held", "cpu")
    view = CHUNK
    count = max(1, args.pins // view)
    source = torch.ones(view + count * 4096, dtype=torch.uint8)  # touched; views 4 KiB apart are distinct pins
    out = torch.empty(view, dtype=torch.uint8)
    t0 = time.monotonic()
    for i in range(count):
        pins.cast_to_device(source[i * 4096: i * 4096 + view], "cpu", model=model, out=out)
    pins.end_prompt()  # the model is no prompt's: its pins are the first a pressure check frees
    s = pins.stats()
    print(json.dumps({"ready": True, "pinned": s["pinned_bytes"], "pins": s["pins"], "seconds": time.monotonic() - t0,
                      "refused": s["bypassed"], "relieve_calls": s["relieve_calls"],
                      "headroom": int(conf["headroom"]), "headroom_source": sources["headroom"],
                      "pin_reserve": int(conf["pin_reserve"]), "relieve_slack": int(conf["relieve_slack"]),
                      "monitor": conf["monitor"] == "true",
                      "monitor_running": s["monitor"] == 1, "interval_ms": int(conf["monitor_interval_ms"]),
                      "cap": int(conf["cap"]), "torch_pins": os.path.dirname(pins.__file__),
                      "library": os.path.realpath(pins.library_path())}), flush=True)
    # The times of the pressure checks that found pressure (relieve_calls moves
    # only then: no prompt or node boundary runs here), with the bytes freed.
    relieved: List[Tuple[float, int]] = []
    done = threading.Event()

    def watch() -> None:
        calls = pins.stats()["relieve_calls"]
        while not done.is_set():
            s = pins.stats()
            if s["relieve_calls"] != calls:
                calls = s["relieve_calls"]
                relieved.append((time.monotonic(), s["pressure_freed_bytes"]))
            time.sleep(0.002)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    sys.stdin.readline()
    done.set()
    watcher.join()
    s = pins.stats()
    print(json.dumps({"pinned": s["pinned_bytes"], "pins": s["pins"], "pressure_freed_bytes": s["pressure_freed_bytes"],
                      "relieve_calls": s["relieve_calls"], "evicted_bytes": s["evicted_bytes"],
                      "committed_bytes": s["committed_bytes"], "relieved": relieved}), flush=True)
    del source
    return 0


def role_hog(args: argparse.Namespace) -> int:
    """Allocates and touches `args.target` bytes in 64 MiB chunks, never while
    available RAM is below `args.floor`; gives up after waiting `args.give_up` s
    for it to come back. Holds what it got for `args.hold` s, then exits."""
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # were the kernel to kill, the hog first
    available = available_fn(args.cgroup_dir, args.limit)
    chunks: List[bytearray] = []
    waits, waited, gave_up = 0, 0.0, False
    t0 = time.monotonic()
    while len(chunks) * CHUNK < args.target:
        if available() < args.floor:
            waits += 1
            w0 = time.monotonic()
            while available() < args.floor:
                if time.monotonic() - w0 > args.give_up:
                    gave_up = True
                    break
                time.sleep(0.002)
            waited += time.monotonic() - w0
            if gave_up:
                break
        b = bytearray(CHUNK)
        b[::4096] = b"\x01" * (CHUNK // 4096)  # every page touched
        chunks.append(b)
    grown = time.monotonic() - t0
    print(json.dumps({"allocated": len(chunks) * CHUNK, "seconds": grown, "floor_waits": waits,
                      "waited_s": waited, "gave_up": gave_up}), flush=True)
    time.sleep(args.hold)
    return 0


# --- the check ---

def rss_anon(pid: int) -> int:
    """The anonymous memory a process holds (its pins, its tensors): RssAnon."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Available RAM every `period` seconds, timestamped, and what the pins
    process holds every tenth sample."""

    def __init__(self, available, period: float, pins_pid: int):
        super().__init__(daemon=True)
        self.available, self.period, self.pins_pid = available, period, pins_pid
        self.samples: List[Tuple[float, int]] = []
        self.held: List[Tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), self.available()))
            if len(self.samples) % 10 == 1:
                self.held.append((time.monotonic(), rss_anon(self.pins_pid)))
            time.sleep(self.period)

    def held_at(self, t: float) -> int:
        return next((h for ht, h in reversed(self.held) if ht <= t), self.held[0][1] if self.held else 0)


def episodes(samples: List[Tuple[float, int]], line: int, start: float, end: float) -> List[Tuple[float, float]]:
    """(start, length) of every stretch of samples below `line` that begins in
    [start, end]; one still open at the last sample has length inf."""
    out, below_since = [], None
    for t, a in samples:
        if a < line and below_since is None and start <= t <= end:
            below_since = t
        elif a >= line and below_since is not None:
            out.append((below_since, t - below_since))
            below_since = None
    if below_since is not None:
        out.append((below_since, float("inf")))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--machine", action="store_true", help="run against the whole machine, not a cgroup of its own")
    p.add_argument("--limit", default="8G", help="the cgroup's memory limit (default 8G)")
    p.add_argument("--pins", default=None,
                   help="bytes to pin (default: 60%% of the cgroup's limit, or 40%% of RAM with --machine)")
    p.add_argument("--floor", default=None,
                   help="the hog never allocates below this much available RAM (default: 256M in the cgroup, "
                        "1G with --machine)")
    p.add_argument("--give-up", type=float, default=5.0, help="seconds the hog waits at the floor before it stops")
    p.add_argument("--hold", type=float, default=1.0, help="seconds the hog holds its memory before it exits")
    p.add_argument("--sample-ms", type=float, default=2.0, help="how often available RAM is read (default 2 ms)")
    p.add_argument("--episodes", action="store_true", help="list every episode below the headroom")
    p.add_argument("--grace-ms", type=float, default=50.0,
                   help="how late past one monitor period the first pressure check of an episode may come: "
                        "the scheduling of a loaded machine (default 50 ms)")
    p.add_argument("--no-monitor", action="store_true", help="pins without its pressure monitor (monitor:false)")
    p.add_argument("--role", choices=("pins", "hog"), help=argparse.SUPPRESS)
    p.add_argument("--target", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cgroup-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.limit = parse_size(args.limit)
    args.floor = parse_size(args.floor) if args.floor else (GiB if args.machine else 256 * MiB)
    if args.role == "pins":
        args.pins = parse_size(args.pins)
        return role_pins(args)
    if args.role == "hog":
        return role_hog(args)

    ram = meminfo()["MemTotal"]
    cgroup = None if args.machine else Cgroup(args.limit)
    try:
        return check(args, ram, cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()


def check(args: argparse.Namespace, ram: int, cgroup: Optional[Cgroup]) -> int:
    r = cgroup.limit if cgroup else ram
    pin_bytes = parse_size(args.pins) if args.pins else int(r * (0.6 if cgroup else 0.4))
    available = available_fn(cgroup.dir if cgroup else None, r)
    a0 = available()
    if a0 < pin_bytes + 3 * args.floor:
        print(f"hog_check: {gib(a0)} GiB available, too little to pin {gib(pin_bytes)} GiB and leave the hog room; "
              f"stopping before anything is allocated", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(CHECKOUT, "python_bindings"),
                                                      env.get("PYTHONPATH")]))
    # The default budget (derived headroom, pin_reserve, monitor), with the pool's
    # cap (default: the pin ceiling, 40% of R without swap) raised to what is pinned.
    conf = [f"cap:{pin_bytes + 256 * MiB}"] + (["monitor:false"] if args.no_monitor else [])
    env["PINS_CONF"] = ",".join(conf)
    preexec = cgroup.enter if cgroup else None
    me = [sys.executable, os.path.abspath(__file__), "--limit", str(r), "--floor", str(args.floor)]
    if cgroup:
        me += ["--cgroup-dir", cgroup.dir]
    oom0 = vmstat_oom_kills()

    pins = subprocess.Popen(me + ["--role", "pins", "--pins", str(pin_bytes)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, preexec_fn=preexec)
    ready = json.loads(pins.stdout.readline() or "{}")
    if not ready.get("ready"):
        pins.kill()
        print(f"hog_check: the pins process did not start (exit {pins.wait()})", file=sys.stderr)
        return 1
    headroom, interval = ready["headroom"], ready["interval_ms"]
    a1 = available()
    # What takes available RAM to the headroom and the relief's slack past it,
    # plus 3/4 of what pins holds: were nothing given back, the hog would stop
    # at the floor; with the monitor, pins keeps about a quarter of its pins.
    target = max(0, a1 - headroom - ready["relieve_slack"]) + ready["pinned"] * 3 // 4

    held0 = rss_anon(pins.pid) - ready["pinned"]  # the pins process without its pins
    sampler = Sampler(available, args.sample_ms / 1000, pins.pid)
    sampler.start()
    time.sleep(0.2)
    t_hog = time.monotonic()
    hog = subprocess.Popen(me + ["--role", "hog", "--target", str(target), "--give-up", str(args.give_up),
                                 "--hold", str(args.hold)], stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
    hog_out, _ = hog.communicate()
    t_end = time.monotonic()
    time.sleep(0.3)
    sampler.stop.set()
    sampler.join()
    hog_status = hog.returncode
    grown = json.loads(hog_out.splitlines()[0]) if hog_out.strip() else {}
    pins.stdin.write("stop\n")
    pins.stdin.flush()
    after = json.loads(pins.stdout.readline() or "{}")
    pins_status = pins.wait()
    oom = vmstat_oom_kills() - oom0
    cg_oom = cgroup.oom_kills() - cgroup.oom_kills_at_start if cgroup else 0

    during = [a for t, a in sampler.samples if t_hog <= t <= t_end]
    eps = episodes(sampler.samples, headroom, t_hog, t_end)
    lengths = [e[1] for e in eps]
    period, grace = interval / 1000, args.grace_ms / 1000
    relieved = [t for t, _ in after.get("relieved", [])]
    # The first pressure check in each episode (from its start), where one came
    # before it ended; an episode a check already under way ended has none.
    first_checks = [next((t - start for t in relieved if start <= t <= start + length), None) for start, length in eps]
    waits = [w for w in first_checks if w is not None]
    late_checks = [w for w in waits if w > period + grace]
    where = (f"a memory cgroup of its own ({cgroup.dir}, cgroup {'v2' if cgroup.v2 else 'v1'}, limit {gib(cgroup.limit)} "
             f"GiB)" if cgroup else "this process's cgroup, against the whole machine")
    print(f"hog check: {where}; MemTotal {gib(ram)} GiB; {os.cpu_count()} CPUs")
    print(f"pins: headroom {ready['headroom'] / MiB:.0f} MiB ({ready['headroom_source']}), pin_reserve "
          f"{ready['pin_reserve'] / MiB:.0f} MiB, monitor {'on' if ready['monitor_running'] else 'off'} "
          f"(interval {interval} ms), PINS_CONF {env['PINS_CONF']}")
    print(f"pins: torch_pins from {ready['torch_pins']}, {ready['library']}")
    print(f"pins held {gib(ready['pinned'])} GiB in {ready['pins']} pins before the hog "
          f"({100 * ready['pinned'] / r:.0f}% of {'the limit' if cgroup else 'RAM'}; {ready['refused']} casts refused); "
          f"available then {gib(a1)} GiB")
    print(f"hog: target {gib(target)} GiB, allocated and touched {gib(grown.get('allocated', 0))} GiB in "
          f"{grown.get('seconds', 0):.2f} s; waited at the {gib(args.floor)} GiB floor {grown.get('floor_waits', 0)} "
          f"times ({grown.get('waited_s', 0):.2f} s in all); gave up: {'yes' if grown.get('gave_up') else 'no'}")
    print(f"available while the hog ran ({len(during)} samples): min {gib(min(during, default=0))} GiB; below the "
          f"headroom in {len(eps)} episodes, longest "
          f"{max(lengths, default=0) * 1000:.0f} ms, median {statistics.median(lengths) * 1000 if lengths else 0:.0f} ms; "
          f"{sum(x > period for x in lengths)} longer than one monitor period ({interval} ms)")
    if waits:
        print(f"the first pressure check of an episode came {min(waits) * 1000:.0f}-{max(waits) * 1000:.0f} ms after "
              f"its start ({len(waits)} of {len(eps)} episodes; the others ended with a check already under way)")
    else:
        print("no pressure check came in any episode")
    print(f"pins after: held {gib(after.get('pinned', 0))} GiB in {after.get('pins', 0)} pins; pressure checks freed "
          f"{gib(after.get('pressure_freed_bytes', 0))} GiB in {after.get('relieve_calls', 0) - ready['relieve_calls']} "
          f"calls")
    if args.episodes:
        for start, length in eps:
            low = min((a for t, a in sampler.samples if start <= t <= start + length), default=0)
            checks = [f"{(t - start) * 1000:.0f} ms ({gib(b)} GiB freed so far)" for t, b in after.get("relieved", [])
                      if start - 0.05 <= t <= start + length + 0.05]
            print(f"  episode at {start - t_hog:7.3f} s: {length * 1000:6.1f} ms below the headroom, min {gib(low)} "
                  f"GiB; pins held about {gib(max(0, sampler.held_at(start) - held0))} GiB at its start; pressure "
                  f"checks at {', '.join(checks) or 'none'}")
    killed = [name for name, st in (("pins", pins_status), ("hog", hog_status)) if st != 0]
    print(f"OOM kills: /proc/vmstat oom_kill +{oom}" + (f", the cgroup's +{cg_oom}" if cgroup else "") +
          f"; exit status: pins {pins_status}, hog {hog_status}")
    reached_floor = grown.get("floor_waits", 0) > 0
    ok = oom == 0 and cg_oom == 0 and not killed and (args.no_monitor or (not late_checks and not reached_floor))
    print(f"RESULT {'ok' if ok else 'FAILED'} mode={'machine' if not cgroup else 'cgroup'} "
          f"monitor={'off' if args.no_monitor else 'on'} pinned_gib={gib(ready['pinned'])} "
          f"hog_gib={gib(grown.get('allocated', 0))} min_available_gib={gib(min(during, default=0))} "
          f"episodes={len(eps)} longest_ms={max(lengths, default=0) * 1000:.0f} "
          f"first_check_ms={max(waits, default=0) * 1000:.0f} period_ms={interval} "
          f"hog_reached_floor={'yes' if reached_floor else 'no'} "
          f"oom_kills={oom + cg_oom}")
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
