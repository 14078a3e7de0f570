#!/usr/bin/env python3
"""Draws the simulator's plot from its JSON report (docs/SIMULATOR.md "Plot").

    build/bin/pins-sim --trace TRACE --sequence all --json > report.json
    python profiling/sim/plot.py report.json out.png      # REPORT may be - (stdin)

One panel per sequence: the GiB each policy reads from disk per run as bars,
the run's lower bound as a black line and its W as a grey dashed one. Needs
matplotlib (python_bindings/requirements-dev.txt); it draws with the Agg
backend, so no display is needed. The figure is 1000 pixels wide and 330 high
per sequence.

Exit status: 0; 2 for bad usage or a report that is not pins-sim's JSON, with a
message that names the file and the field; 1 without matplotlib or when the PNG
cannot be written.
"""
import argparse
import json
import sys
from typing import Dict, List, NamedTuple

GIB = float(1 << 30)
WIDTH_PX, PANEL_PX, DPI = 1000, 330, 100
# matplotlib's tab10 colours, one per policy; another policy gets grey.
COLORS = {"lru": "tab:red", "mru": "tab:blue", "trace": "tab:green", "oracle": "tab:purple"}


class ReportError(Exception):
    pass


class Run(NamedTuple):
    lower_bound: float  # GiB
    used: float  # W, GiB
    disk: Dict[str, float]  # policy -> GiB read from disk


class Panel(NamedTuple):
    title: str
    policies: List[str]
    runs: List[Run]


def panels(report: dict, origin: str) -> List[Panel]:
    """The panels of a pins-sim --json report (one sequence, or --sequence all)."""
    def field(obj, key, where):
        if not isinstance(obj, dict) or key not in obj:
            raise ReportError(f"{origin}: {where}: missing \"{key}\" (is it pins-sim --json output?)")
        return obj[key]

    runs = field(report, "runs", "(top level)")
    sequences = report["sequences"] if "sequences" in report else [report]
    out = []
    for i, seq in enumerate(sequences):
        where = f"sequences[{i}]" if "sequences" in report else "(top level)"
        name = field(seq, "sequence", where)
        policies = [field(p, "policy", f"{where}.policies[{k}]") for k, p in enumerate(field(seq, "policies", where))]
        by_run: Dict[int, Run] = {}
        for k, r in enumerate(runs):
            if field(r, "sequence", f"runs[{k}]") != name:
                continue
            n = field(r, "run", f"runs[{k}]")
            run = by_run.setdefault(n, Run(field(r, "lower_bound_bytes", f"runs[{k}]") / GIB,
                                           field(r, "used_bytes", f"runs[{k}]") / GIB, {}))
            run.disk[field(r, "policy", f"runs[{k}]")] = field(r, "disk_bytes", f"runs[{k}]") / GIB
        if not by_run:
            raise ReportError(f"{origin}: runs: none for sequence \"{name}\"")
        ordered = [by_run[n] for n in sorted(by_run)]
        for n, run in zip(sorted(by_run), ordered):
            for p in policies:
                if p not in run.disk:
                    raise ReportError(f"{origin}: runs: no run {n} of policy \"{p}\" in sequence \"{name}\"")
        out.append(Panel(f"{report.get('trace', '?')} - {name} (disk GiB per run)", policies, ordered))
    return out


def draw(figure_panels: List[Panel], out_path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(len(figure_panels), 1, squeeze=False,
                             figsize=(WIDTH_PX / DPI, PANEL_PX * len(figure_panels) / DPI), dpi=DPI)
    for ax, panel in zip(axes[:, 0], figure_panels):
        n, bars = len(panel.runs), max(1, len(panel.policies))
        width = 0.8 / bars
        for b, policy in enumerate(panel.policies):
            xs = [i - 0.4 + (b + 0.5) * width for i in range(n)]
            ax.bar(xs, [r.disk[policy] for r in panel.runs], width * 0.95, color=COLORS.get(policy, "tab:gray"),
                   label=policy, zorder=2)
        for i, r in enumerate(panel.runs):
            ax.hlines(r.used, i - 0.42, i + 0.42, colors="grey", linestyles="--", linewidth=1, zorder=3,
                      label="W" if i == 0 else None)
            ax.hlines(r.lower_bound, i - 0.42, i + 0.42, colors="black", linewidth=2.5, zorder=3,
                      label="lower bound" if i == 0 else None)
        top = max([1.0] + [r.used for r in panel.runs] + [d for r in panel.runs for d in r.disk.values()])
        ax.set_ylim(0, top * 1.08)
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_xticks(range(n), [str(i + 1) for i in range(n)])
        ax.set_xlabel("run")
        ax.set_ylabel("GiB")
        ax.grid(axis="y", color="#e4e4e4", zorder=0)
        ax.set_title(panel.title, loc="left", fontsize=10, pad=20)
        handles, labels = ax.get_legend_handles_labels()
        order = panel.policies + ["lower bound", "W"]
        pairs = sorted(zip(handles, labels), key=lambda hl: order.index(hl[1]))
        ax.legend([h for h, _ in pairs], [l for _, l in pairs], loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(panel.policies) + 2, frameon=False,
                  fontsize=8, borderaxespad=0.1)
    fig.tight_layout()
    fig.savefig(out_path, format="png", metadata={"Software": None})
    plt.close(fig)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="plot.py", description="Draws the PNG plot of a pins-sim --json report: disk GiB per run and policy, "
                                    "with the lower bound and W per run; one panel per sequence.")
    parser.add_argument("report", help="pins-sim --json output; - reads standard input")
    parser.add_argument("out", help="the PNG file to write")
    args = parser.parse_args(argv)
    try:
        if args.report == "-":
            text, origin = sys.stdin.read(), "(stdin)"
        else:
            origin = args.report
            with open(args.report) as f:
                text = f.read()
        try:
            report = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReportError(f"{origin}: not valid JSON: {e}") from None
        if not isinstance(report, dict):
            raise ReportError(f"{origin}: expected one JSON object, got {type(report).__name__}")
        figure_panels = panels(report, origin)
    except (OSError, ReportError) as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    try:
        draw(figure_panels, args.out)
    except ImportError as e:
        print(f"plot.py: needs matplotlib ({e}); install it with pip install -r python_bindings/requirements-dev.txt",
              file=sys.stderr)
        return 1
    except OSError as e:
        print(f"plot.py: cannot write {args.out}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
