"""Host RAM of a diffusers pipeline under each offload mode: pins against
diffusers' own, on the same pipeline, in one run.

A DDPMPipeline with a random-weight UNet2DModel (--width scales it: 192 gives
about 100 MB of fp32 weights) is built once and saved with save_pretrained
(safetensors) into a temporary directory; each mode then runs in a fresh
process that loads it from there and makes --calls calls of --steps steps on
--device:
  plain              DDPMPipeline.from_pretrained(dir) (.to(device) off the CPU)
  pins               the same, then torch_pins.diffusers.enable(pipe, device)
  pins-file          the UNet built on the meta device and filled with
                     load_state_dict(pins.load_file(...), assign=True), then enable
  model-cpu-offload  pipe.enable_model_cpu_offload(device=device)
  sequential-offload pipe.enable_sequential_cpu_offload(device=device)
  group-offload      pipe.enable_group_offload(device, "block_level", 1 block a
                     group, use_stream on a CUDA device)
A mode diffusers refuses or fails on this machine (on the CPU: use_stream needs
a device with streams; accelerate's sequential offload fails in the call) is
reported with its message.
For each mode: the RAM the process holds for the pipeline (VmRSS after the calls
less VmRSS before loading, torch and diffusers imported and a tiny pipeline
called once, so that library pages a call touches are in already), its peak (VmHWM less
the same), of it the anonymous and file-backed pages, and the pinned bytes
(pins' pool: committed and page-locked; torch's pinned host memory on a CUDA
device). The last line is `RESULT ram_<mode>_vs_plain=<ratio> ...` (held RAM
against plain's, lower is less; `refused` for a mode that did not run)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ("plain", "pins", "pins-file", "model-cpu-offload", "sequential-offload", "group-offload")


def status():
    """/proc/self/status's memory lines, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def build(width):
    import torch
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(width, 2 * width), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)
    return DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=50))


def child(a):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "python_bindings"))
    import torch_pins as pins
    import torch_pins.diffusers  # noqa: F401
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
    device = torch.device(a.device)
    # One call of a tiny pipeline first: the libraries' pages a call touches are
    # then in before the reading every figure is taken against.
    warm = build(8)
    warm.set_progress_bar_config(disable=True)
    warm(batch_size=1, num_inference_steps=1, output_type="np")
    del warm
    base = status()
    if a.child == "pins-file":
        config = UNet2DModel.load_config(os.path.join(a.dir, "unet"))
        with torch.device("meta"):
            unet = UNet2DModel.from_config(config)
        unet.load_state_dict(pins.load_file(os.path.join(a.dir, "unet", "diffusion_pytorch_model.safetensors")),
                             assign=True)
        pipe = DDPMPipeline(unet=unet.eval(), scheduler=DDPMScheduler.from_pretrained(a.dir, subfolder="scheduler"))
    else:
        pipe = DDPMPipeline.from_pretrained(a.dir)
    pipe.set_progress_bar_config(disable=True)
    loaded = status()
    try:
        if a.child == "plain" and device.type != "cpu":
            pipe.to(device)
        elif a.child in ("pins", "pins-file"):
            pins.diffusers.enable(pipe, device)
        elif a.child == "model-cpu-offload":
            pipe.enable_model_cpu_offload(device=device)
        elif a.child == "sequential-offload":
            pipe.enable_sequential_cpu_offload(device=device)
        elif a.child == "group-offload":
            pipe.enable_group_offload(device, offload_type="block_level", num_blocks_per_group=1,
                                      use_stream=device.type == "cuda")
    except Exception as e:
        print(json.dumps({"mode": a.child, "refused": f"{type(e).__name__}: {e}"}))
        return 0
    t0 = time.perf_counter()
    try:
        for i in range(a.calls):
            pipe(batch_size=1, generator=torch.Generator().manual_seed(i), num_inference_steps=a.steps,
                 output_type="np")
    except Exception as e:  # diffusers' or accelerate's own failure on this device
        print(json.dumps({"mode": a.child, "refused": f"failed in the call: {type(e).__name__}: {e}"}))
        return 0
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / a.calls
    after = status()
    s = pins.stats()
    torch_pinned = 0
    if device.type == "cuda" and hasattr(torch.cuda, "host_memory_stats"):
        torch_pinned = int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))
    weights = sum(t.nbytes for t in list(pipe.unet.parameters()) + list(pipe.unet.buffers()))
    print(json.dumps({"mode": a.child, "weights": weights, "held": after["VmRSS"] - base["VmRSS"],
                      "loaded": loaded["VmRSS"] - base["VmRSS"], "peak": after["VmHWM"] - base["VmRSS"],
                      "anon": after["RssAnon"] - base["RssAnon"], "file": after["RssFile"] - base["RssFile"],
                      "pins_committed": s["committed_bytes"], "pins_locked": s["locked_bytes"],
                      "torch_pinned": torch_pinned, "seconds_per_call": seconds}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=192, help="the UNet's first block width (default 192, ~100 MB)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if a.width < 8 or a.width % 8 or a.steps <= 0 or a.calls <= 0 or bad or not modes:
        print(f"bench_diffusers_ram: --width must be a multiple of 8 from 8, --steps and --calls positive, --modes "
              f"of {', '.join(MODES)}; got width {a.width}, steps {a.steps}, calls {a.calls}, modes {a.modes!r}",
              file=sys.stderr)
        return 2
    if a.child:
        return child(a)
    import torch
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        print("bench_diffusers_ram: no CUDA device here; nothing measured")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as d:
        build(a.width).save_pretrained(d)
        for mode in modes:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--dir", d, "--device", a.device,
                   "--steps", str(a.steps), "--calls", str(a.calls)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode != 0 or not lines:
                print(f"bench_diffusers_ram: mode {mode} failed (rc {out.returncode}):\n{out.stderr[-2000:]}",
                      file=sys.stderr)
                return 1
            rows.append(json.loads(lines[-1]))
    mib = 1 << 20
    print(f"DDPMPipeline, UNet2DModel width {a.width}, {a.calls} calls of {a.steps} steps on {a.device}; MiB")
    print(f"{'mode':<20}{'weights':>9}{'held':>9}{'peak':>9}{'anon':>9}{'file':>9}{'pins':>9}{'locked':>9}"
          f"{'torch pinned':>14}{'s/call':>9}")
    for r in rows:
        if "refused" in r:
            print(f"{r['mode']:<20}refused: {r['refused'][:110]}")
            continue
        print(f"{r['mode']:<20}{r['weights'] / mib:9.1f}{r['held'] / mib:9.1f}{r['peak'] / mib:9.1f}"
              f"{r['anon'] / mib:9.1f}{r['file'] / mib:9.1f}{r['pins_committed'] / mib:9.1f}"
              f"{r['pins_locked'] / mib:9.1f}{r['torch_pinned'] / mib:14.1f}{r['seconds_per_call']:9.3f}")
    plain = next((r for r in rows if r["mode"] == "plain" and "held" in r), None)
    result = []
    for r in rows:
        if r["mode"] == "plain":
            continue
        key = f"ram_{r['mode'].replace('-', '_')}_vs_plain"
        if "refused" in r or plain is None or plain["held"] <= 0:
            result.append(f"{key}={'refused' if 'refused' in r else 'n/a'}")
        else:
            result.append(f"{key}={r['held'] / plain['held']:.2f}")
    print("RESULT " + " ".join(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
