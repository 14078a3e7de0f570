"""A lowvram forward: the weights on the CPU, each layer brought to the device for
its forward and dropped after, by every way at hand, in one run (Note [Copies
that overlap compute] in python_bindings/torch_pins/_prefetch.py).

A stack of --layers torch TransformerEncoderLayers (d_model --dim, --dtype),
--batch x --tokens tokens, timed as the median of --reps forwards on --device:
  resident       the whole stack on the device (compute alone: the lower bound)
  to             each layer's tensors .to(device) before its forward (pageable copies)
  pins           torch_pins.nn.stream(stack, device, prefetch=0): one gathered
                 transfer per layer from its pin, on the compute stream
  pins-prefetch  the same with prefetch=--prefetch: the next layers copied on a
                 side stream while a layer runs
  group-offload  diffusers' apply_group_offloading(block_level, 1 layer a group,
                 use_stream on a CUDA device: its prefetch, from pinned copies)
Each copy of the stack holds the same weights; every mode's output is checked
against resident's. Prints per mode ms per forward and the peak device memory,
then `RESULT prefetch_vs_to=.. prefetch_vs_pins=.. prefetch_vs_group_offload=..
pins_vs_to=.. prefetch_vs_resident=..` (time ratios, lower is faster;
`n/a` for a mode that did not run: diffusers not importable). On the CPU the
same modes run in order (a dry run of the script; no figure to read)."""
import argparse
import copy
import os
import statistics
import sys
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python_bindings"))
import torch_pins as pins  # noqa: E402
import torch_pins.nn  # noqa: E402,F401

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class Stack(nn.Module):
    def __init__(self, layers, dim, heads):
        super().__init__()
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
                                     for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def to_hooks(stack, device):
    """Each layer's tensors .to(device) for its forward, the CPU tensors back after."""
    def pre(module, args):
        module._saved = [(d, k, d[k]) for m in module.modules() for d in (m._parameters, m._buffers)
                         for k in list(d) if d[k] is not None]
        for d, k, t in module._saved:
            d[k] = t.to(device)

    def post(module, args, out):
        for d, k, t in module._saved:
            d[k] = t
        module._saved = []
    for layer in stack.layers:
        layer.register_forward_pre_hook(pre)
        layer.register_forward_hook(post)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--prefetch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if min(a.layers, a.dim, a.heads, a.batch, a.tokens, a.reps, a.prefetch) <= 0 or a.dim % a.heads:
        print(f"bench_prefetch: --layers, --dim, --heads, --batch, --tokens, --reps and --prefetch must be positive "
              f"and --dim a multiple of --heads; got {vars(a)}", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_prefetch: no CUDA device here; nothing measured")
        return 0
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = DTYPES[a.dtype] if cuda else torch.float32
    torch.manual_seed(0)
    base = Stack(a.layers, a.dim, a.heads).to(dtype).eval().requires_grad_(False)
    x = torch.randn(a.batch, a.tokens, a.dim, dtype=dtype).to(device)
    weight_bytes = sum(t.nbytes for t in base.state_dict().values())

    def make(mode):
        stack = copy.deepcopy(base)
        if mode == "resident":
            return stack.to(device), None
        if mode == "to":
            to_hooks(stack, device)
        elif mode in ("pins", "pins-prefetch"):
            pins.stream(stack, device, prefetch=a.prefetch if mode == "pins-prefetch" else 0, name=f"bench-{mode}")
        elif mode == "group-offload":
            try:
                from diffusers.hooks import apply_group_offloading
            except ImportError as e:
                return None, f"diffusers not importable: {e}"
            apply_group_offloading(stack, onload_device=device, offload_device=torch.device("cpu"),
                                   offload_type="block_level", num_blocks_per_group=1, non_blocking=cuda,
                                   use_stream=cuda)
        return stack, None

    times, peaks, want = {}, {}, None
    print(f"{a.layers} x TransformerEncoderLayer(d={a.dim}, {a.heads} heads) {a.dtype if cuda else 'fp32'}, "
          f"{weight_bytes / 2**20:.0f} MiB of weights; input {a.batch} x {a.tokens}; on {device}; "
          f"median of {a.reps}")
    for mode in ("resident", "to", "pins", "pins-prefetch", "group-offload"):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        stack, why = make(mode)
        if stack is None:
            print(f"  {mode:<15} not run: {why}")
            continue
        samples = []
        with torch.inference_mode():
            for i in range(a.reps + 2):  # two warm-ups: pins' pins and the recorded order
                sync()
                t0 = time.perf_counter()
                out = stack(x)
                sync()
                if i >= 2:
                    samples.append(time.perf_counter() - t0)
        if want is None:
            want = out
        elif not torch.allclose(out.float(), want.float(), rtol=1e-2, atol=1e-2):
            print(f"bench_prefetch: {mode}'s output differs from resident's", file=sys.stderr)
            return 1
        times[mode] = statistics.median(samples)
        peaks[mode] = torch.cuda.max_memory_allocated() if cuda else 0
        print(f"  {mode:<15} {times[mode] * 1e3:9.2f} ms   {weight_bytes / times[mode] / 1e9:6.1f} GB/s of weights"
              f"   peak device memory {peaks[mode] / 2**20:8.0f} MiB")
        del stack, out

    def ratio(x, y):
        return f"{times[x] / times[y]:.3f}" if x in times and y in times else "n/a"
    print(f"RESULT prefetch_vs_to={ratio('pins-prefetch', 'to')} prefetch_vs_pins={ratio('pins-prefetch', 'pins')} "
          f"prefetch_vs_group_offload={ratio('pins-prefetch', 'group-offload')} pins_vs_to={ratio('pins', 'to')} "
          f"prefetch_vs_resident={ratio('pins-prefetch', 'resident')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
