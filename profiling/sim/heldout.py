"""Issue 39's figures on the held-out sets (docs/SIMULATOR.md, "Held-out sets"):
per set and per shape, how often a policy reads more than the better of the
others plus a layer a run.

    python profiling/sim/heldout.py [--sim build/bin/pins-sim] [--seeds 1-47] [--scenarios 40]
        [--policies lru,mru,trace,clairvoyant] [--csv-dir DIR] [--jobs 2]

For each seed S it reads DIR/uS.csv, and first writes it where it is missing:
`pins-sim --suite --suite-kind unseen --scenarios N --seed S --policy P --csv DIR/uS.csv`
(--jobs seeds at a time, one pins-sim thread each). Every figure is disk bytes
over the runs after each scenario's first; "a layer" is the CSV's
allowance_bytes (one largest layer a run). It prints:
- per set: trace / oracle in total, the scenarios where trace reads more than
  min(lru, mru) plus a layer ("over"), the largest trace / mru among those
  where trace reads more than mru plus a layer ("worst / mru", 0: none), and
  clairvoyant's and mru's counts over the same line as trace's;
- per shape (the CSV's pattern column): the scenarios, and for each policy
  those where it reads more than the best of the other real policies (lru,
  mru, trace, less itself) plus a layer; trace's column is its over. A policy
  that wins on the average can still lose to the better of two others on many
  scenarios, and this says how often each one does;
- a line `RESULT over=... sets_over_1=... over_1_25_mru=... scenarios=... sets=...`.
"""
import argparse
import collections
import csv
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from choose_default import seeds  # this folder: the script's own, first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL = ["lru", "mru", "trace"]


def scenarios(path):
    """{name: (pattern, allowance, oracle, {policy: disk bytes})} from one CSV."""
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            entry = out.setdefault(row["name"], (row["pattern"], int(row["allowance_bytes"]),
                                                 int(row["oracle_bytes"]), {}))
            entry[3][row["policy"]] = int(row["disk_bytes"])
    return out


def ensure_csv(sim, seed, n, policies, path, runs_path=None):
    """Writes the set's CSV at `path` (and its per-run CSV at `runs_path`,
    when given) unless each one asked for exists."""
    if os.path.exists(path) and (runs_path is None or os.path.exists(runs_path)):
        return
    args = [sim, "--suite", "--suite-kind", "unseen", "--scenarios", str(n), "--seed", str(seed),
            "--policy", ",".join(policies), "--threads", "1", "--csv", path + ".part"]
    if runs_path:
        args += ["--runs-csv", runs_path + ".part"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    os.replace(path + ".part", path)
    if runs_path:
        os.replace(runs_path + ".part", runs_path)


def over_line(p, allowance):
    return min(p["lru"], p["mru"]) + allowance


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", default=os.path.join(ROOT, "build", "bin", "pins-sim"))
    ap.add_argument("--seeds", default="1-47", help="held-out seeds, A-B")
    ap.add_argument("--scenarios", type=int, default=40, help="scenarios a set")
    ap.add_argument("--policies", default="lru,mru,trace,clairvoyant",
                    help="what pins-sim replays; lru, mru and trace are needed")
    ap.add_argument("--csv-dir", default=os.path.join(ROOT, "build", "heldout"),
                    help="where each set's CSV is read from, and written first when missing")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    policies = a.policies.split(",")
    for p in REAL:
        if p not in policies:
            sys.exit(f"heldout.py: --policies must name {p}; got {a.policies!r}")
    os.makedirs(a.csv_dir, exist_ok=True)
    seed_list = seeds(a.seeds)
    paths = {s: os.path.join(a.csv_dir, f"u{s}.csv") for s in seed_list}
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for f in [pool.submit(ensure_csv, a.sim, s, a.scenarios, policies, paths[s]) for s in seed_list]:
            f.result()

    print(f"{'set':>4} {'trace/oracle':>12} {'over':>5} {'worst/mru':>9} {'clair over':>10} {'mru over':>8}")
    over_total = sets_over_1 = over_125 = count = 0
    shapes = collections.defaultdict(collections.Counter)
    for s in seed_list:
        rows = scenarios(paths[s])
        trace = oracle = 0
        over = clair = mru_over = 0
        worst = 0.0
        for name, (pattern, allowance, oracle_bytes, p) in rows.items():
            missing = [q for q in REAL if q not in p]
            if missing:
                sys.exit(f"heldout.py: {paths[s]} has no {missing} row for {name}")
            count += 1
            trace += p["trace"]
            oracle += oracle_bytes
            line = over_line(p, allowance)
            over += p["trace"] > line
            mru_over += p["mru"] > line
            if "clairvoyant" in p:
                clair += p["clairvoyant"] > line
            if p["trace"] > p["mru"] + allowance:
                ratio = p["trace"] / max(p["mru"], 1)
                worst = max(worst, ratio)
                over_125 += ratio > 1.25
            shape = shapes[pattern]
            shape["scenarios"] += 1
            for q in policies:
                others = [p[o] for o in REAL if o != q]
                shape["beaten " + q] += p[q] > min(others) + allowance
        over_total += over
        sets_over_1 += over > 1
        clair_text = str(clair) if "clairvoyant" in policies else "-"
        print(f"{s:>4} {trace / max(oracle, 1):>12.3f} {over:>5} {worst if worst else 0:>9.2f} {clair_text:>10} "
              f"{mru_over:>8}")

    print()
    print("per shape: the scenarios where each policy reads more than the best of the other real policies "
          "(lru, mru, trace) plus a layer")
    print(f"{'shape':<16} {'scenarios':>9} " + " ".join(f"{q:>11}" for q in policies))
    for pattern in sorted(shapes):
        c = shapes[pattern]
        print(f"{pattern:<16} {c['scenarios']:>9} " +
              " ".join(f"{c['beaten ' + q]:>11}" for q in policies))
    print(f"RESULT over={over_total} sets_over_1={sets_over_1} over_1_25_mru={over_125} scenarios={count} "
          f"sets={len(seed_list)}")


if __name__ == "__main__":
    main()
