"""``python -m torch_pins``: a small command line (also installed as ``torch-pins``).

  stats      the library, its configuration (every key, its value and where it
             came from) and every counter of a fresh process; with --url, those
             of a running ComfyUI with the pins node (its /pins/stats route)
  simulate   the workflow simulator, pins-sim (arguments go to it)
  demo       what ``make demo`` runs: a workflow replayed through pins on real
             safetensors files (profiling/demo/demo.py of the checkout this
             package sits in; arguments go to it)
  share      the shared pins' directory of this user (docs/USAGE.md "One
             pinned copy per host"): its files and bytes; with --clean, what
             processes that died left there goes (RAM in tmpfs)

Exit status: 0 when the command ran (simulate and demo: the tools' own status),
2 for a usage error or a tool that is not available here, with a message that
says where it was looked for: pins-sim when it is not built, the demo when this
package is not in a checkout (an installed wheel).

pins-sim and pins-bench are C++ executables of the source tree (``make build``
puts them in build/bin); the wheel does not ship them: they read the traces and
model data of the repository (profiling/). They are found through $PINS_SIM and
$PINS_BENCH, the ``build/bin`` of the checkout this package sits in, or PATH.
The demo is part of the source tree too (it replays the repository's traces
through pins-sim): only a checkout has it, and it runs in a process of its own
that imports this package.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence, Tuple


# The checkout this package sits in, when it is imported from python_bindings/
# of a clone (make test's editable install) rather than from a wheel.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHECKOUT = os.path.dirname(_PACKAGE_PARENT)
DEMO = os.path.join("profiling", "demo", "demo.py")
USAGE_ERROR = 2


def find_tool(name: str, env: str) -> Tuple[Optional[str], List[str]]:
    """The path of executable `name` ($`env`, the checkout's build/bin, PATH) and
    the places looked at, for the message when it is absent."""
    explicit = os.environ.get(env)
    if explicit:  # said explicitly: no other place is tried
        ok = os.path.isfile(explicit) and os.access(explicit, os.X_OK)
        return (explicit if ok else None), [f"${env}={explicit}, not an executable file"]
    looked = [f"${env} (unset)"]
    in_checkout = os.path.join(_CHECKOUT, "build", "bin", name)
    looked.append(in_checkout)
    if os.path.isfile(in_checkout) and os.access(in_checkout, os.X_OK):
        return in_checkout, looked
    looked.append("PATH")
    on_path = shutil.which(name)
    if on_path:
        return on_path, looked
    return None, looked


def _absent(name: str, env: str, looked: Sequence[str]) -> int:
    print(f"torch_pins: {name} not found (looked at {', '.join(looked)}). It is a C++ executable of the "
          f"source tree, not part of the wheel: run `make build` in a clone of the repository (it lands in "
          f"build/bin), then set {env} to its path or put it on PATH.", file=sys.stderr)
    return USAGE_ERROR


def cmd_stats(args: argparse.Namespace) -> int:
    from . import _report

    if args.url:
        r = _fetch_report(args.url)
        if r is None:
            return USAGE_ERROR
    else:
        import torch_pins as pins

        r = pins.report()
    print(json.dumps(r, indent=1, sort_keys=True) if args.json else _report.text(r))
    return 0


def _fetch_report(url: str) -> Optional[dict]:
    """The report a ComfyUI with the pins node serves at URL/pins/stats; None
    (and a message) when there is none."""
    import urllib.error
    import urllib.request

    route = url.rstrip("/") + "/pins/stats"
    try:
        with urllib.request.urlopen(route, timeout=10) as response:
            r = json.loads(response.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"torch_pins: cannot read {route} ({e}). --url takes the address of a ComfyUI that runs the pins "
              f"node (comfyui/ of the repository), e.g. http://127.0.0.1:8188.", file=sys.stderr)
        return None
    if not isinstance(r, dict) or "config" not in r:
        why = r.get("why") if isinstance(r, dict) else None
        print(f"torch_pins: {route} has no pins report: {why or repr(r)[:200]}", file=sys.stderr)
        return None
    return r


def cmd_simulate(args: argparse.Namespace) -> int:
    sim, looked = find_tool("pins-sim", "PINS_SIM")
    if sim is None:
        return _absent("pins-sim", "PINS_SIM", looked)
    sim_args = list(args.sim_args)
    if sim_args[:1] == ["--"]:
        sim_args = sim_args[1:]
    return subprocess.call([sim, *sim_args])


def cmd_demo(args: argparse.Namespace) -> int:
    script = os.path.join(_CHECKOUT, DEMO)
    if not os.path.isfile(script):
        print(f"torch_pins: demo not found (looked at {script}). The demo is part of the source tree, not of the "
              f"wheel: it replays the repository's traces and needs pins-sim. Run `make demo` in a clone of the "
              f"repository.", file=sys.stderr)
        return USAGE_ERROR
    demo_args = list(args.demo_args)
    if demo_args[:1] == ["--"]:
        demo_args = demo_args[1:]
    # The demo's replays import torch_pins: this package, however this process found it.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    return subprocess.call([sys.executable, script, *demo_args], env=env)


def _share_files(path: str) -> Tuple[int, int, bool]:
    """(segment files, their bytes in RAM, whether the index is there) of a share directory."""
    segments = size = 0
    index = False
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0, 0, False
    for e in entries:
        if e.name == "index":
            index = True
        elif e.name.startswith("seg-"):
            segments += 1
            try:
                size += e.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                pass
    return segments, size, index


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


# A process that attaches to the share and leaves it as any user of pins does:
# the attach reclaims the slots of dead processes (their leases and unfinished
# fills) and removes every file no entry names; the exit detaches, and the last
# process out removes every file and the directory.
_CLEAN = r"""
import json, torch_pins as pins
print(json.dumps({k: v for k, v in pins.stats().items() if k.startswith("share_")}), flush=True)
"""


def cmd_share(args: argparse.Namespace) -> int:
    root = args.share_dir
    path = os.path.join(root, f"pins-{os.geteuid()}")
    segments, size, index = _share_files(path)
    here = "absent" if not os.path.isdir(path) else (
        f"{segments} segment files, {_mib(size)} of RAM, {'an index' if index else 'no index'}")
    print(f"share directory {path}: {here}")
    if not args.clean:
        return 0
    if not os.path.isdir(path):
        return 0
    env = dict(os.environ, PINS_CONF=f"share:true,share_dir:{root},monitor:false,prewarm:false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", _CLEAN], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"torch_pins share --clean: the cleaning process failed:\n{out.stderr}", file=sys.stderr)
        return 1
    seen = json.loads(out.stdout.splitlines()[0])
    if not seen.get("share_state"):
        reason = next((k.split(".", 1)[1] for k in seen if k.startswith("share_state.")), "unknown")
        print(f"torch_pins share --clean: cannot attach to {path} ({reason}): {out.stderr.strip()}", file=sys.stderr)
        return 1
    after, after_size, after_index = _share_files(path)
    live = seen.get("share_processes", 1) - 1  # the cleaning process itself was one
    print(f"cleaned: {segments - after} segment files ({_mib(max(size - after_size, 0))}) removed, "
          f"{seen.get('share_dead_slots', 0)} dead processes' slots reclaimed; "
          + (f"{live} live processes keep {after} files ({_mib(after_size)})" if os.path.isdir(path)
             else "no live process: the directory is gone"))
    return 0


# The commands whose arguments all go to another tool: run, the argument list's
# name, its usage word, help and description.
PASSTHROUGH = {
    "simulate": (cmd_simulate, "sim_args", "PINS_SIM_ARGS", "run the workflow simulator pins-sim (arguments go to it)",
                 "Runs pins-sim, the workflow simulator (docs/SIMULATOR.md), with the arguments that follow: "
                 "`python -m torch_pins simulate -- --help` lists its own. pins-sim is a C++ executable of the "
                 "source tree (make build puts it in build/bin), not part of the wheel; it is found through "
                 "$PINS_SIM, the build/bin of the checkout this package is in, or PATH."),
    "demo": (cmd_demo, "demo_args", "DEMO_ARGS",
             "what `make demo` runs: a workflow replayed through pins on real files (arguments go to it)",
             "Runs profiling/demo/demo.py of the checkout this package sits in, what `make demo` runs: a workflow "
             "trace replayed layer by layer through pins on real safetensors files, per policy and without pins, "
             "beside pins-sim's prediction. `python -m torch_pins demo -- --help` lists its options. The demo is "
             "part of the source tree, not of the wheel; it needs pins-sim (found as for simulate)."),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torch_pins",
        description="pins: a pinned host-RAM cache for model weights. Exit status 0 when the command ran, "
                    "2 for a usage error or a tool that is not available here.")
    p.add_argument("--version", action="version", version=f"torch-pins {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    stats = sub.add_parser("stats", help="the library, configuration, backend and counters of a fresh process",
                           description="Loads the library in this fresh process and prints PINS_CONF, the backend, "
                                       "the configuration in force (one line `key value (source)` per key: default, "
                                       "derived from the machine, or PINS_CONF) and every counter of pins.stats().")
    stats.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    stats.add_argument("--url", metavar="URL", help="read a running ComfyUI's pins instead (its /pins/stats route, "
                                                     "served by the pins node), e.g. http://127.0.0.1:8188")
    stats.set_defaults(run=cmd_stats)
    share = sub.add_parser("share", help="the shared pins' directory of this user; --clean: what dead processes left",
                           description="Prints the files and bytes of this user's shared pins directory "
                                       "(<share_dir>/pins-<uid>, docs/USAGE.md). With --clean, a process attaches "
                                       "to it and exits as any user of pins does: the segments and slots of "
                                       "processes that died (kill -9, os._exit) go, and with no live process left "
                                       "the directory goes too. Live processes' pins are kept.")
    share.add_argument("--share-dir", default="/dev/shm", metavar="DIR",
                       help="the share_dir of the processes (PINS_CONF share_dir; default /dev/shm)")
    share.add_argument("--clean", action="store_true", help="remove what processes that died left there")
    share.set_defaults(run=cmd_share)
    for name, (run, dest, usage, help_text, description) in PASSTHROUGH.items():
        cmd = sub.add_parser(name, help=help_text, description=description,
                             usage=f"python -m torch_pins {name} [-h] [--] {usage}...")
        cmd.add_argument(dest, nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        cmd.set_defaults(run=run)
    return p


def _version() -> str:
    from ._version import __version__
    return __version__


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `simulate` (`demo`) is pins-sim's (the demo's), options
    # included; argparse would take them for its own.
    if argv[:1] and argv[0] in PASSTHROUGH and argv[1:] not in (["-h"], ["--help"]):
        run, dest = PASSTHROUGH[argv[0]][:2]
        return run(argparse.Namespace(**{dest: argv[1:]}))
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `... stats | head`: the reader has gone, as for any other command
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
