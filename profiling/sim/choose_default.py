"""Which eviction policy should be the default: every real policy scored on
everything together (docs/SIMULATOR.md "The default policy").

    python profiling/sim/choose_default.py [--sim build/bin/pins-sim] [--seeds 1-5] [--held-out 6]

Three figures per policy, each disk bytes read over the runs after the first:
- suite: the total over the suite's seeds (`pins-sim --suite`) / the oracle's;
- held-out: the same on a seed no variant was tuned on;
- traces: the bundled traces (profiling/traces), every sequence, six runs, a
  seed change counted three times (the most common ComfyUI sequence), over the
  same weighted sum of mru's.
The score is their product; the lowest wins. The suite runs in pins-sim's own
threads; this script only adds up its CSV rows. Prints one table and a line
`RESULT default=<policy> ...`."""
import argparse
import csv
import glob
import os
import subprocess
import sys
import tempfile

POLICIES = ["lru", "mru", "trace", "reuse"]
SEED_CHANGE_WEIGHT = 3
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def seeds(text):
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def run_csv(sim, args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "out.csv")
        subprocess.run([sim, *args, "--csv", path], check=True, stdout=subprocess.DEVNULL)
        with open(path, newline="") as f:
            return list(csv.DictReader(f))


def suite_ratio(sim, seed_list, conf):
    disk = {p: 0 for p in POLICIES}
    oracle = 0
    for s in seed_list:
        for row in run_csv(sim, ["--suite", "--seed", str(s), "--policy", ",".join(POLICIES), *conf]):
            if row["policy"] in disk:
                disk[row["policy"]] += int(row["disk_bytes"])
            if row["policy"] == POLICIES[0]:
                oracle += int(row["oracle_bytes"])
    return {p: disk[p] / oracle for p in POLICIES}


def traces_disk(sim, conf):
    disk = {p: 0.0 for p in POLICIES}
    for trace in sorted(glob.glob(os.path.join(ROOT, "profiling", "traces", "*.json"))):
        rows = run_csv(sim, ["--trace", trace, "--sequence", "all", "--runs", "6", "--policy", ",".join(POLICIES),
                             *conf])
        for row in rows:
            if int(row["run"]) > 1:
                weight = SEED_CHANGE_WEIGHT if row["sequence"] == "seed_change" else 1
                disk[row["policy"]] += weight * int(row["disk_bytes"])
    return disk


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", default=os.path.join(ROOT, "build", "bin", "pins-sim"))
    ap.add_argument("--seeds", default="1-5", help="suite seeds, A-B")
    ap.add_argument("--held-out", default="6", help="the held-out seed(s), A-B")
    ap.add_argument("--conf", default="", help="balancer configuration for every run (PINS_CONF syntax)")
    a = ap.parse_args()
    conf = ["--conf", a.conf] if a.conf else []
    suite = suite_ratio(a.sim, seeds(a.seeds), conf)
    held = suite_ratio(a.sim, seeds(a.held_out), conf)
    traces = traces_disk(a.sim, conf)
    rel = {p: traces[p] / traces["mru"] for p in POLICIES}
    score = {p: suite[p] * held[p] * rel[p] for p in POLICIES}
    print(f"{'policy':<8} {'suite ' + a.seeds:>12} {'held-out ' + a.held_out:>12} {'traces/mru':>11} {'traces GiB':>11}"
          f" {'score':>7}")
    for p in POLICIES:
        print(f"{p:<8} {suite[p]:12.3f} {held[p]:12.3f} {rel[p]:11.3f} {traces[p] / 2**30:11.1f} {score[p]:7.4f}")
    best = min(POLICIES, key=lambda p: score[p])
    print(f"RESULT default={best} " + " ".join(f"score_{p}={score[p]:.4f}" for p in POLICIES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
