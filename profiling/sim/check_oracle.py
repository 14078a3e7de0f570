#!/usr/bin/env python3
"""Checks pins-sim's oracle against an independent Belady over its access dump.

    build/bin/pins-sim --trace T --sequence S --policy oracle --json --dump-accesses acc.jsonl > oracle.json
    profiling/sim/check_oracle.py acc.jsonl oracle.json

Replays the `weights` lines of the dump with capacity `pin_capacity_bytes`
(docs/SIMULATOR.md "Replay", the oracle): on a miss the weight is read; it is
kept, evicting the cached weights whose next use is farthest (never again first,
larger first), unless one of those is needed before it. Exits 1 when a run's
disk bytes differ from the JSON's. Standard library only.
"""
import json
import sys


def belady(accesses):
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
        cap, key, size = a["pin_capacity_bytes"], (a["sequence"], a["storage"]), a["bytes"]
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
        disk = belady([json.loads(line) for line in f])
    with open(json_path) as f:
        report = json.load(f)
    bad = 0
    for run in report["runs"]:
        if run["policy"] != "oracle":
            continue
        want = disk.get((run["sequence"], run["run"]), 0)
        if want != run["disk_bytes"]:
            print(f"{run['sequence']} run {run['run']}: pins-sim {run['disk_bytes']}, independent {want}")
            bad += 1
    print("oracle matches" if bad == 0 else f"{bad} runs differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
