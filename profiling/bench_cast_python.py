"""The cast op's cost per call from Python (docs/PERFORMANCE.md, "cast from Python"), against
``x.clone()`` measured in the same run.

For a 4 KiB fp16 source on the CPU device, the mean time per call of:
  clone     x.clone()                                            (the baseline)
  op-hit    torch.ops.pins.cast_to_device.default(x, ..., model=m)  (a hit, the op alone)
  fast-hit  torch_pins._C.cast_to_device(x, dev, None, False, m)   (a hit, the extension's entry
            alone: Note [Python fast path]; left out where the build made no torch_pins._C)
  hit       torch_pins.cast_to_device(x, dev, model=m)             (a hit through the wrapper, which
            calls the extension where it loaded, else the op)
  plain     torch_pins.cast_to_device(x, dev)                      (model=-1: no pin)
  miss      torch_pins.cast_to_device(y, dev, model=m), y a new 4 KiB source each call
            (a new pin: the budget check, the memory reading, the fill)
each the median of --reps repetitions of --calls calls, the repetitions of the
cases interleaved (misses: of min(--calls, 2000) new sources, measured after).
The last line is ``RESULT py_clone_us=.. py_op_hit_us=.. py_fast_hit_us=..
py_hit_us=.. py_plain_us=.. py_miss_us=.. py_hit_overhead_us=..``
(py_hit_overhead_us = hit - clone). On a CPU-only machine a hit and a clone
copy the same 4 KiB, so the overhead is what pins adds per call. The library is
found as torch_pins finds it ($PINS_LIBRARY, else the copy in the package)."""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python_bindings"))

import torch  # noqa: E402
import torch_pins as pins  # noqa: E402


def per_call_us(cases, calls, reps):
    """{name: median per-call us} of each case. The repetitions interleave the
    cases (each case once per repetition), so a noisy neighbour on a shared
    machine slows all of them alike rather than one figure."""
    for fn in cases.values():  # warm up
        for _ in range(min(calls, 100)):
            fn()
    out = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(times) for name, times in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per repetition (default 20000)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions; the median counts (default 5)")
    args = ap.parse_args()
    if args.calls < 1 or args.reps < 1:
        ap.error("--calls and --reps must be positive")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    pins.configure("policy:mru,headroom:1G,pin_reserve:512M")
    dev = torch.device("cpu")
    x = torch.randn(2048).to(torch.float16)  # 4 KiB
    m = pins.register_model("bench-cast-python", "cpu")
    op = torch.ops.pins.cast_to_device.default
    pins.cast_to_device(x, dev, model=m)  # the pin
    hits_before = pins.stats()["hits"]
    cases = {
        "py_clone_us": lambda: x.clone(),
        "py_op_hit_us": lambda: op(x, dev, None, False, m, "weights", False, None),
    }
    if pins._C is not None:
        fast = pins._C.cast_to_device
        cases["py_fast_hit_us"] = lambda: fast(x, dev, None, False, m)
    cases["py_hit_us"] = lambda: pins.cast_to_device(x, dev, model=m)
    cases["py_plain_us"] = lambda: pins.cast_to_device(x, dev)
    figures = per_call_us(cases, args.calls, args.reps)
    hits = pins.stats()["hits"] - hits_before
    misses = []
    for _ in range(args.reps):
        fresh = [torch.randn(2048).to(torch.float16) for _ in range(min(args.calls, 2000))]
        t0 = time.perf_counter()
        for y in fresh:
            pins.cast_to_device(y, dev, model=m)
        misses.append((time.perf_counter() - t0) / len(fresh) * 1e6)
        pins.forget_model(m)  # the next repetition starts from no pins again
        m = pins.register_model("bench-cast-python", "cpu")
    figures["py_miss_us"] = statistics.median(misses)
    pins.forget_model(m)
    figures["py_hit_overhead_us"] = figures["py_hit_us"] - figures["py_clone_us"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; 4 KiB fp16 source, CPU device; "
          f"{args.calls} calls x {args.reps} repetitions, medians of the per-call means")
    print(f"hits served: {hits} (every op-hit, fast-hit and hit call, and their warm-up)")
    print(f"torch_pins._C: {pins._C.__file__ if pins._C is not None else 'not loaded (no py_fast_hit_us)'}")
    print("on a CPU-only machine a hit and a clone copy the same bytes: the difference is what pins adds")
    for k, v in figures.items():
        print(f"  {k:20s} {v:8.3f} us")
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
