"""What a miss costs: a new pin filled from a source in memory and copied on,
against the plain copy a user makes without pins (docs/PERFORMANCE.md, "a miss";
Note [Chunked fill] in ops/cast_path.h).

One layer-sized fp16 source (--mib MiB), cast to --device, interleaved in every
repetition:
  plain          source.to(device, bfloat16)       (no pins: pageable, converted)
  pins miss      invalidate_model, then pins.cast_to_device(..., dtype=bfloat16)
                 (a new pin in the memory the last one left warm: fill + copy)
  pins hit       pins.cast_to_device(..., dtype=bfloat16) again (from the pin)
and the same three without a conversion (plain: source.to(device); on the CPU
source.clone()). Prints the medians of --reps and, last,
`RESULT miss_ratio=.. hit_ratio=.. miss_same_ratio=.. hit_same_ratio=..` (pins
time / plain time: lower is faster). On a CPU-only machine a hit moves the same
bytes as the plain copy and a miss one copy more; on a GPU the pin's DMA is what
pins gains."""
import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python_bindings"))
import torch_pins as pins  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=32, help="MiB of fp16 in the source (default 32, a layer)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    if a.mib <= 0 or a.reps <= 0:
        print(f"bench_miss: --mib and --reps must be positive, got {a.mib} and {a.reps}", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_miss: no CUDA device here; nothing measured")
        return 0
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    source = torch.randn(a.mib << 19, dtype=torch.float32).to(torch.float16)
    bf16 = torch.bfloat16
    pins.configure("policy:mru")
    m = pins.register_model("bench-miss", device.type)

    def miss(dtype):
        pins.invalidate_model(m)
        return pins.cast_to_device(source, device, dtype=dtype, model=m)

    def plain_same():
        return source.clone() if device.type == "cpu" else source.to(device)

    cases = {
        "plain": lambda: source.to(device, bf16),
        "miss": lambda: miss(bf16),
        "hit": lambda: pins.cast_to_device(source, device, dtype=bf16, model=m),
        "plain_same": plain_same,
        "miss_same": lambda: miss(None),
        "hit_same": lambda: pins.cast_to_device(source, device, model=m),
    }
    times = {k: [] for k in cases}
    before = pins.stats()
    for _ in range(a.reps):
        for name, fn in cases.items():
            sync()
            t0 = time.perf_counter()
            out = fn()
            sync()
            times[name].append(time.perf_counter() - t0)
            del out
    after = pins.stats()
    # Every miss made a pin and every hit found one: else the figures mean something else.
    misses = after[f"model.{m}.weights.misses"] - before.get(f"model.{m}.weights.misses", 0)
    hits = after[f"model.{m}.weights.hits"] - before.get(f"model.{m}.weights.hits", 0)
    print(f"bench_miss: {a.mib} MiB fp16 to {device} (bf16 and as is), {a.reps} repetitions, medians; "
          f"misses {misses}, hits {hits}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"  {k:<11} {v * 1e3:9.2f} ms")
    pins.forget_model(m)
    print(f"RESULT miss_ratio={med['miss'] / med['plain']:.3f} hit_ratio={med['hit'] / med['plain']:.3f} "
          f"miss_same_ratio={med['miss_same'] / med['plain_same']:.3f} "
          f"hit_same_ratio={med['hit_same'] / med['plain_same']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
