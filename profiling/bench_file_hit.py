"""A hit on a pin of a pins.load_file tensor against a hit on a pin of an
ordinary tensor of the same size, in the same run: what Note [Changed files]
adds to a hit (the guard's change count, a look at the file at most every 2 ms).

    .venv/bin/python profiling/bench_file_hit.py [--reps 7] [--hits 20000]

Prints `RESULT file_hit_us=.. plain_hit_us=.. file_hit_extra_us=.. file_hit_ratio=..`
(medians of --reps rounds, plain and file interleaved)."""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_bindings"))
import torch_pins as pins  # noqa: E402


def per_hit_us(t, model, hits):
    cast = pins.cast_to_device
    start = time.perf_counter()
    for _ in range(hits):
        cast(t, "cpu", model=model)
    return (time.perf_counter() - start) / hits * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--hits", type=int, default=20000)
    args = ap.parse_args()
    from safetensors.torch import save_file
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.safetensors")
        save_file({"w": torch.randn(32, 32)}, path)
        mapped = pins.load_file(path)["w"]
        plain = torch.randn(32, 32)
        model = pins.register_model("bench", "cpu")
        for t in (plain, mapped):
            pins.cast_to_device(t, "cpu", model=model)  # pinned: every cast below is a hit
        before = pins.stats()
        rounds = [(per_hit_us(plain, model, args.hits), per_hit_us(mapped, model, args.hits)) for _ in range(args.reps)]
        after = pins.stats()
        assert after["hits"] - before["hits"] == 2 * args.reps * args.hits, "not every cast was a hit"
    plain_us = statistics.median(r[0] for r in rounds)
    file_us = statistics.median(r[1] for r in rounds)
    print(f"RESULT file_hit_us={file_us:.3f} plain_hit_us={plain_us:.3f} file_hit_extra_us={file_us - plain_us:.3f} "
          f"file_hit_ratio={file_us / plain_us:.3f}")


if __name__ == "__main__":
    main()
