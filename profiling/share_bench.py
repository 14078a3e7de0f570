"""Note [Shared pins] on one host: N processes each cast every layer of the
same safetensors model 3 times with share:true, then one more process starts
after they finished their run (they stay alive, holding their pins).

    .venv/bin/python profiling/share_bench.py [--gib 2] [--procs 4] [--rounds 3]

Prints one RESULT line:
- ram_ratio: host RAM the N processes' pins use (the Pss of their shared
  segments plus their private pinned bytes, from /proc/PID/smaps) over what
  one process alone uses for the same model with sharing off, measured in the
  same run (target <= 1.15);
- second_disk_ratio: bytes the late process read from disk (/proc/PID/io
  read_bytes, with the model dropped from the page cache before it starts)
  over the model's bytes (target <= 0.05);
- warm_s, warm_first_s, warm_ratio: the late process's time to a warm model
  (its first pass over every layer) against the mean of the first N's;
- private_ram_ratio: the same N processes with sharing off, for comparison.

The model file lives in a temporary directory on disk (--dir), not in tmpfs,
so a read of it is a disk read."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, os, sys, time
import torch
sys.path.insert(0, os.path.join(sys.argv[1], "python_bindings"))
import torch_pins as pins
path, rounds = sys.argv[2], int(sys.argv[3])
def read_bytes():
    with open("/proc/self/io") as f:
        return int(next(l for l in f if l.startswith("read_bytes:")).split()[1])
r0 = read_bytes()
t0 = time.perf_counter()
tensors = pins.load_file(path)
m = pins.register_model("share-bench", "cpu")
pins.mark_prompt([m])
warm = None
with torch.inference_mode():
    for r in range(rounds):
        for name, t in tensors.items():
            out = pins.cast_to_device(t, "cpu", model=m)
            if r == rounds - 1 and name == next(iter(tensors)):
                assert torch.equal(out.view(torch.int16), t.view(torch.int16))
        if warm is None:
            warm = time.perf_counter() - t0
s = pins.stats()
print(json.dumps({"warm_s": warm, "read_bytes": read_bytes() - r0, "committed": s["committed_bytes"],
                  "joins": s.get("share_joins", 0), "fills": s.get("share_fills", 0),
                  "waits": s.get("share_waits", 0), "busy": s.get("share_busy", 0)}), flush=True)
sys.stdin.readline()  # held until the driver measured
"""


def make_model(path, gib):
    import torch
    from safetensors.torch import save_file
    layer = 32 << 20
    n = max(1, int(gib * (1 << 30)) // layer)
    g = torch.Generator().manual_seed(0)
    tensors = {f"layer{i:03d}.weight": torch.randint(-2**15, 2**15, (layer // 2,), dtype=torch.int16, generator=g)
               .view(torch.float16).reshape(4096, -1) for i in range(n)}
    save_file(tensors, path)
    return os.path.getsize(path)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def pinned_ram(pid, share_dir, committed):
    """Pss of the process's mappings under share_dir, plus its private pinned bytes."""
    pss = 0
    current = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                current = head[5] if len(head) > 5 else ""
            elif line.startswith("Pss:") and current and current.startswith(share_dir):
                pss += int(head[1]) * 1024
    return pss + committed


def start(path, rounds, conf):
    env = dict(os.environ, PINS_CONF=conf)
    return subprocess.Popen([sys.executable, "-c", WORKER, ROOT, path, str(rounds)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def run_group(path, procs, rounds, conf):
    ps = [start(path, rounds, conf) for _ in range(procs)]
    reports = [json.loads(p.stdout.readline()) for p in ps]
    return ps, reports


def stop(ps):
    for p in ps:
        p.stdin.write("\n")
        p.stdin.flush()
    for p in ps:
        p.wait(timeout=120)
        assert p.returncode == 0, p.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the model is written (default: a temp dir under /var/tmp)")
    ap.add_argument("--share-root", default="/dev/shm")
    args = ap.parse_args()
    share_dir = os.path.join(args.share_root, f"pins-{os.geteuid()}")
    base = "monitor:false,prewarm:false"
    with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp") as d:
        path = os.path.join(d, "model.safetensors")
        model_bytes = make_model(path, args.gib)

        # One process alone, sharing off: the baseline.
        drop_cache(path)
        ps, (solo,) = run_group(path, 1, args.rounds, base)
        one = pinned_ram(ps[0].pid, share_dir, solo["committed"])
        stop(ps)

        # N processes, sharing off, for comparison.
        drop_cache(path)
        ps, reps = run_group(path, args.procs, args.rounds, base)
        private = sum(pinned_ram(p.pid, share_dir, r["committed"]) for p, r in zip(ps, reps))
        stop(ps)

        # N processes, sharing on; then a late one while they hold their pins.
        drop_cache(path)
        conf = f"{base},share:true,share_dir:{args.share_root}"
        ps, reps = run_group(path, args.procs, args.rounds, conf)
        shared = sum(pinned_ram(p.pid, share_dir, r["committed"]) for p, r in zip(ps, reps))
        drop_cache(path)
        late_ps, (late,) = run_group(path, 1, args.rounds, conf)
        stop(late_ps)
        stop(ps)
        left = os.path.exists(share_dir)

    warm_first = sum(r["warm_s"] for r in reps) / len(reps)
    print(f"# model {model_bytes / (1 << 30):.2f} GiB, {args.procs} processes x {args.rounds} rounds; "
          f"shared group: joins {sum(r['joins'] for r in reps)}, fills {sum(r['fills'] for r in reps)}, "
          f"waits {sum(r['waits'] for r in reps)}, busy {sum(r['busy'] for r in reps)}, "
          f"read {sum(r['read_bytes'] for r in reps)} B; solo read {solo['read_bytes']} B; "
          f"late: joins {late['joins']}, fills {late['fills']}, read {late['read_bytes']} B; "
          f"files left after the last exit: {left}")
    print(f"RESULT ram_ratio={shared / one:.3f} second_disk_ratio={late['read_bytes'] / model_bytes:.4f} "
          f"warm_s={late['warm_s']:.3f} warm_first_s={warm_first:.3f} warm_ratio={late['warm_s'] / warm_first:.3f} "
          f"private_ram_ratio={private / one:.3f} one_process_bytes={one} model_bytes={model_bytes}")


if __name__ == "__main__":
    main()
