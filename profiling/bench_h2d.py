"""Host-to-device copies of real layer sizes through pins against plain torch.

Per size class of profiling/data/model_params.csv (one model's tensors), times:
  pageable  source.to(device)                        (no pins)
  pins-hit  pins.cast_to_device(..., model=m)         (a warm pin: pinned DMA)
  pinned    torch pinned tensor .to(device, non_blocking=True)
and prints ratios against pageable measured in the same run; the last line is
`RESULT h2d_hit_vs_pageable=<x> h2d_hit_vs_torch_pinned=<y>` (time ratios, lower
is faster). Needs a CUDA device; prints a reason and exits 0 without one."""
import argparse
import csv
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def sizes_of(model, limit):
    out = []
    with open(os.path.join(HERE, "data", "model_params.csv")) as f:
        for row in csv.reader(line for line in f if not line.startswith("#")):
            if row[0] == model:
                out.append(int(row[3]))
    out.sort(reverse=True)
    return out[:limit]


def timed(fn, reps):
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="flux1_dev")
    ap.add_argument("--tensors", type=int, default=64, help="the largest N tensors of the model")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_h2d: no CUDA device here; nothing measured")
        return 0
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python_bindings"))
    import torch_pins as pins

    numels = sizes_of(a.model, a.tensors)
    srcs = [torch.randn(n, dtype=torch.float32).to(torch.bfloat16) for n in numels]
    pinned = [s.pin_memory() for s in srcs]
    m = pins.register_model(a.model, "cuda")
    for s in srcs:  # warm the pins
        pins.cast_to_device(s, "cuda", model=m)
    total = sum(s.numel() * s.element_size() for s in srcs)

    t_page = timed(lambda: [s.to("cuda") for s in srcs], a.reps)
    t_hit = timed(lambda: [pins.cast_to_device(s, "cuda", non_blocking=True, model=m) for s in srcs], a.reps)
    t_pin = timed(lambda: [p.to("cuda", non_blocking=True) for p in pinned], a.reps)
    gb = total / 1e9
    print(f"{a.model}: {len(srcs)} tensors, {gb:.2f} GB per pass, best of {a.reps}")
    print(f"  pageable .to(cuda)          {t_page * 1e3:9.1f} ms  {gb / t_page:6.1f} GB/s")
    print(f"  pins hit (non_blocking)     {t_hit * 1e3:9.1f} ms  {gb / t_hit:6.1f} GB/s")
    print(f"  torch pinned (non_blocking) {t_pin * 1e3:9.1f} ms  {gb / t_pin:6.1f} GB/s")
    print(f"RESULT h2d_hit_vs_pageable={t_hit / t_page:.3f} h2d_hit_vs_torch_pinned={t_hit / t_pin:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
