"""Issue 39's bounds (docs/SIMULATOR.md, "Issue 39's tenth round"): what a
policy that picks, run by run, among the balancer's own policies could read on
the held-out sets, counted against the line heldout.py draws.

    python profiling/sim/selector_bounds.py [--sim build/bin/pins-sim] [--seeds 1-100] [--scenarios 40]
        [--csv-dir DIR] [--jobs 2]

For each seed S it reads DIR/uS.runs.csv (pins-sim --runs-csv: each policy's
disk bytes run by run), first writing it, and DIR/uS.csv beside it, where it
is missing. Each selector runs one of the policies (its experts) each run, and
its figure for run r is that expert's own bytes in run r of the expert's own
replay: as if the selector's account of every expert were exact and a switch
took the expert's state along at no cost. So each figure is a bound no real
selector of those experts reaches, not a policy's result. The selectors:
  trace, clairvoyant  the policies themselves, counted as heldout.py counts them
  hindsight           per scenario, the lesser of trace and mru in total: it knows
                      the whole scenario before it starts
  leader-2            each run, the lesser in total over the scenario's earlier
                      counted runs of trace and mru (ties: trace); follow the
                      leader, the rule of set dueling with a shadow of mru
  leader-3            the same among lru, mru and trace
  switch-R            trace until its total so far is more than R times mru's
                      plus a layer a run so far, then mru for the rest
Every figure is over the runs after each scenario's first. For each selector
it prints a line: over (scenarios over min(lru, mru) plus a layer a run),
sets_over_1 (sets with more than one), over_1_25_mru (scenarios over mru
plus a layer a run by more than 1.25x mru) and the worst set's total / oracle.
"""
import argparse
import collections
import csv
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from choose_default import seeds  # this folder: the script's own, first on sys.path
from heldout import ROOT, ensure_csv, over_line

POLICIES = ["lru", "mru", "trace", "clairvoyant", "oracle"]
SWITCH_RATIOS = (1.1, 1.25, 1.5)


def read_runs(path):
    """{name: (layer_bytes, {policy: [disk bytes of run 0, 1, ...]})} from one per-run CSV."""
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            layer, policies = out.setdefault(row["name"], (int(row["layer_bytes"]), {}))
            runs = policies.setdefault(row["policy"], [])
            if int(row["run"]) != len(runs):
                sys.exit(f"selector_bounds.py: {path}: {row['name']} {row['policy']}: run {row['run']} "
                         f"out of order (expected {len(runs)})")
            runs.append(int(row["disk_bytes"]))
    for name, (_, policies) in out.items():
        missing = [p for p in POLICIES if p not in policies]
        if missing:
            sys.exit(f"selector_bounds.py: {path} has no {missing} rows for {name}")
    return out


def leader(experts):
    """Each run, the expert with the least total over the earlier counted runs; ties to the first named."""
    def choose(totals, run, layer):
        return min(experts, key=lambda e: (totals[e], experts.index(e)))
    return choose


def switch(ratio):
    """trace until its total so far is over ratio x mru's plus a layer a run, then mru for good."""
    switched = False

    def choose(totals, run, layer):
        nonlocal switched
        switched = switched or totals["trace"] > ratio * totals["mru"] + layer * (run - 1)
        return "mru" if switched else "trace"
    return choose


def online(p, layer, choose, experts):
    """The selector's bytes over runs 1.. of one scenario: run by run, the chosen expert's own."""
    totals = dict.fromkeys(experts, 0)
    cost = 0
    for run in range(1, len(p["trace"])):
        cost += p[choose(totals, run, layer)][run]
        for e in experts:
            totals[e] += p[e][run]
    return cost


def counted(p, policy):
    return sum(p[policy][1:])


# Each selector: (policies' runs, layer) -> bytes over the runs after the first.
SELECTORS = {
    "trace": lambda p, layer: counted(p, "trace"),
    "clairvoyant": lambda p, layer: counted(p, "clairvoyant"),
    "hindsight": lambda p, layer: min(counted(p, "trace"), counted(p, "mru")),
    "leader-2": lambda p, layer: online(p, layer, leader(["trace", "mru"]), ["trace", "mru"]),
    "leader-3": lambda p, layer: online(p, layer, leader(["trace", "mru", "lru"]), ["trace", "mru", "lru"]),
    **{f"switch-{r:g}": (lambda p, layer, r=r: online(p, layer, switch(r), ["trace", "mru"])) for r in SWITCH_RATIOS},
}


def count(sets):
    """sets: {seed: {name: (layer, runs)}} -> {selector: Counter of over, sets_over_1, over_1_25_mru},
    {selector: the worst set's total / oracle}"""
    result = {sel: collections.Counter() for sel in SELECTORS}
    worst = dict.fromkeys(SELECTORS, 0.0)
    for scenarios in sets.values():
        over = collections.Counter()
        total = collections.Counter()
        oracle = 0
        for layer, p in scenarios.values():
            allowance = layer * (len(p["trace"]) - 1)
            totals = {q: counted(p, q) for q in ("lru", "mru")}
            line, mru = over_line(totals, allowance), totals["mru"]
            oracle += counted(p, "oracle")
            for sel, f in SELECTORS.items():
                cost = f(p, layer)
                total[sel] += cost
                over[sel] += cost > line
                result[sel]["over_1_25_mru"] += cost > mru + allowance and cost > 1.25 * mru
        for sel in SELECTORS:
            result[sel]["over"] += over[sel]
            result[sel]["sets_over_1"] += over[sel] > 1
            worst[sel] = max(worst[sel], total[sel] / max(oracle, 1))
    return result, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", default=os.path.join(ROOT, "build", "bin", "pins-sim"))
    ap.add_argument("--seeds", default="1-100", help="held-out seeds, A-B")
    ap.add_argument("--scenarios", type=int, default=40, help="scenarios a set")
    ap.add_argument("--csv-dir", default=os.path.join(ROOT, "build", "heldout"),
                    help="where each set's CSVs are read from, and written first when missing")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    os.makedirs(a.csv_dir, exist_ok=True)
    seed_list = seeds(a.seeds)
    paths = {s: (os.path.join(a.csv_dir, f"u{s}.csv"), os.path.join(a.csv_dir, f"u{s}.runs.csv")) for s in seed_list}
    policies = [p for p in POLICIES if p != "oracle"]  # pins-sim --suite adds the oracle
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for f in [pool.submit(ensure_csv, a.sim, s, a.scenarios, policies, *paths[s]) for s in seed_list]:
            f.result()
    sets = {s: read_runs(paths[s][1]) for s in seed_list}
    result, worst = count(sets)
    print(f"{'selector':<12} {'over':>5} {'sets_over_1':>11} {'over_1_25_mru':>13} {'worst set/oracle':>16}")
    for sel, c in result.items():
        print(f"{sel:<12} {c['over']:>5} {c['sets_over_1']:>11} {c['over_1_25_mru']:>13} {worst[sel]:>16.3f}")
    print(f"sets={len(sets)} scenarios={sum(len(v) for v in sets.values())}")


if __name__ == "__main__":
    main()
