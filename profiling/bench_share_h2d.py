"""Host-to-device from a shared pin (Note [Shared pins]) against a private pin,
in the same run: a first process fills the shared segments of a model and holds
them; a second process, with share:true, joins them (its own cudaHostRegister
of the same pages) and times warm casts to the device; a third, with sharing
off, times the same casts from private pins.

    python3 profiling/bench_share_h2d.py [--layers 16] [--layer-mib 64] [--reps 20]

Prints `RESULT h2d_shared_us=.. h2d_private_us=.. h2d_shared_vs_private=..`
(median microseconds of one layer's cast; the ratio is a time ratio, lower is
faster). Needs a CUDA device and Linux; prints a reason and exits 0 without."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, os.path.join(sys.argv[1], "python_bindings"))
import torch_pins as pins
path, reps, hold = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "hold"
tensors = pins.load_file(path)
m = pins.register_model("share-h2d", "cuda")
pins.mark_prompt([m])
for t in tensors.values():
    pins.cast_to_device(t, "cuda", model=m)  # pinned: a join (shared) or a fill (private)
torch.cuda.synchronize()
times = []
for _ in range(reps):
    for t in tensors.values():
        t0 = time.perf_counter()
        pins.cast_to_device(t, "cuda", model=m, non_blocking=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
s = pins.stats()
print(json.dumps({"us": statistics.median(times), "joins": s.get("share_joins", 0), "hits": s["hits"]}), flush=True)
if hold:
    sys.stdin.readline()
"""


def run(path, reps, conf, hold=False):
    env = dict(os.environ, PINS_CONF=conf)
    p = subprocess.Popen([sys.executable, "-c", WORKER, ROOT, path, str(reps), "hold" if hold else "go"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return p, json.loads(p.stdout.readline())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--layer-mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available() or not sys.platform.startswith("linux"):
        print("bench_share_h2d: needs a CUDA device on Linux; skipped")
        return
    from safetensors.torch import save_file
    n = args.layer_mib << 20
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d, tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        path = os.path.join(d, "m.safetensors")
        save_file({f"l{i}": torch.randint(0, 255, (n,), dtype=torch.uint8) for i in range(args.layers)}, path)
        conf = f"share:true,share_dir:{root}"
        holder, _ = run(path, 1, conf, hold=True)
        _, shared = run(path, args.reps, conf)
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=120)
        _, private = run(path, args.reps, "share:false")
    assert shared["joins"] == args.layers, shared
    print(f"# {args.layers} x {args.layer_mib} MiB; the second process joined {shared['joins']} segments")
    print(f"RESULT h2d_shared_us={shared['us']:.1f} h2d_private_us={private['us']:.1f} "
          f"h2d_shared_vs_private={shared['us'] / private['us']:.3f}")


if __name__ == "__main__":
    main()
