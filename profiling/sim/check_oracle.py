#!/usr/bin/env python3
"""Checks pins-sim's oracle against an independent Belady over its access dump.

    build/bin/pins-sim --trace T --sequence S --policy oracle,oracle-pins --json --dump-accesses acc.jsonl > o.json
    profiling/sim/check_oracle.py acc.jsonl o.json

Replays the `weights` lines of the dump (docs/SIMULATOR.md "The oracle") with
capacity `ram_capacity_bytes` for the JSON's `oracle` runs and
`pin_capacity_bytes` for its `oracle-pins` runs: on a miss the weight is read;
it is kept, evicting the cached weights whose next use is farthest (never again
first, larger first), unless one of those is needed before it. Exits 1 when a
run's disk bytes differ from the JSON's, or when the JSON has no oracle run.
Standard library only.
"""
import json
import sys


# The JSON's policy name -> the dump's capacity field (Note [Simulator oracle]).
CAPACITY = {"oracle": "ram_capacity_bytes", "oracle-pins": "pin_capacity_bytes"}


def belady(accesses, capacity):
    weights = [a for a in accesses if a["kind"] == "weights"]
    never = float("inf")
    nxt, later = [never] * len(weights), {}
    for i in range(len(weights) - 1, -1, -1):
        key = (weights[i]["sequence"], weights[i]["storage"])
        nxt[i] = later.get(key, never)
        later[key] = i
    cache, used, disk, sequence = {}, 0, {}, None  # key -> (next use, bytes)
    rank = lambda k: (cache[k][0], cache[k][1], k)
    for i, a in enumerate(weights):
        if a["sequence"] != sequence:  # each sequence replays from an empty cache
            cache, used, sequence = {}, 0, a["sequence"]
        cap, key, size = a[capacity], (a["sequence"], a["storage"]), a["bytes"]
        while used > cap:
            victim = max(cache, key=rank)
            used -= cache.pop(victim)[1]
        if key in cache:
            cache[key] = (nxt[i], size)
            continue
        run = (a["sequence"], a["run"])
        disk[run] = disk.get(run, 0) + size
        if size > cap or nxt[i] == never:
            continue
        room, victims = cap - used, []
        for v in sorted(cache, key=rank, reverse=True):
            if room >= size:
                break
            room += cache[v][1]
            victims.append(v)
        if room < size or (victims and cache[victims[-1]][0] < nxt[i]):
            continue
        for v in victims:
            used -= cache.pop(v)[1]
        cache[key] = (nxt[i], size)
        used += size
    return disk


def main(dump_path, json_path):
    with open(dump_path) as f:
        accesses = [json.loads(line) for line in f]
    with open(json_path) as f:
        report = json.load(f)
    bad, checked, disk = 0, 0, {}
    for run in report["runs"]:
        policy = run["policy"]
        if policy not in CAPACITY:
            continue
        if policy not in disk:
            disk[policy] = belady(accesses, CAPACITY[policy])
        want = disk[policy].get((run["sequence"], run["run"]), 0)
        checked += 1
        if want != run["disk_bytes"]:
            print(f"{policy} {run['sequence']} run {run['run']}: pins-sim {run['disk_bytes']}, independent {want}")
            bad += 1
    if checked == 0:
        print("no oracle or oracle-pins runs in " + json_path)
        return 1
    print(f"{', '.join(sorted(disk))} match{'es' if len(disk) == 1 else ''} on {checked} runs" if bad == 0
          else f"{bad} runs differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
