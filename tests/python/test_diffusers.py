"""torch_pins.diffusers (Note [Streamed pipelines]) with tiny random-weight
pipelines built offline: a UNet one (DDPM) and a transformer one (DiT)."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("diffusers")
from diffusers_pipelines import BUILDERS, ddpm, dit, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def delta(pins, before, key):
    return pins.stats().get(key, 0) - before.get(key, 0)


@pytest.fixture
def pd(pins):
    import torch_pins.diffusers as pd
    import torch_pins.nn as pnn
    yield pd
    for m in list(pnn._roots.keys()):
        pnn.unstream(m)


@pytest.mark.parametrize("kind", ["ddpm", "dit"])
def test_outputs_are_bit_identical_and_the_second_call_hits(pins, pd, kind):
    want = run(BUILDERS[kind]())
    pipe = BUILDERS[kind]()
    state = pins.diffusers.enable(pipe)
    assert state.device == torch.device("cpu") and pipe._execution_device == torch.device("cpu")
    assert set(state.components) == ({"unet"} if kind == "ddpm" else {"transformer", "vae"})
    before = pins.stats()
    assert torch.equal(run(pipe), want)
    first = {m: delta(pins, before, f"model.{m}.misses") for m in state.models}
    assert all(n > 0 for n in first.values()), first
    before = pins.stats()
    assert torch.equal(run(pipe), want)
    casts = sum(s["unit_casts"] for s in state.stats().values()) // 2
    assert sum(delta(pins, before, f"model.{m}.hits") for m in state.models) == casts
    assert sum(delta(pins, before, f"model.{m}.misses") for m in state.models) == 0
    names = [k for k in pins.stats() if k.startswith(f"model.{type(pipe).__name__}.")]
    assert names, "each component's pins model is named <Pipeline>.<component>"


def test_each_call_is_a_prompt(pins, pd):
    pipe = ddpm()
    state = pins.diffusers.enable(pipe)
    seen = []
    pipe.unet.register_forward_hook(lambda m, a, o: seen.append(
        (pins.stats()["prompt"], pins.stats()[f"model.{state.models[0]}.in_prompt"])))
    run(pipe)
    assert seen and all(s == (1, 1) for s in seen)
    assert pins.stats()["prompt"] == 0, "the call's prompt ended with it"
    with pins.prompt():
        run(pipe)
        assert pins.stats()["prompt"] == 1, "a prompt the caller opened goes on"


def test_disable_puts_the_pipeline_back(pins, pd):
    from diffusers import DDPMPipeline
    pipe = ddpm()
    hooks = {n: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for n, m in pipe.unet.named_modules()}
    params = {n: p for n, p in pipe.unet.named_parameters()}
    models = pins.stats()["models"]
    pins.diffusers.enable(pipe)
    assert type(pipe) is not DDPMPipeline and isinstance(pipe, DDPMPipeline)
    assert type(pipe).__name__ == "DDPMPipeline" and pins.stats()["models"] == models + 1
    want = run(pipe)
    pins.diffusers.disable(pipe)
    assert type(pipe) is DDPMPipeline and pd.enabled(pipe) is None
    assert {n: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for n, m in pipe.unet.named_modules()} == hooks
    assert all(p is params[n] for n, p in pipe.unet.named_parameters())
    assert pins.stats()["models"] == models
    assert torch.equal(run(pipe), want)
    with pytest.raises(ValueError, match="is not enabled"):
        pins.diffusers.disable(pipe)


def test_other_offload_modes_and_device_moves_are_refused(pins, pd):
    pipe = ddpm()
    pins.diffusers.enable(pipe)
    for name in ("enable_model_cpu_offload", "enable_sequential_cpu_offload", "enable_group_offload"):
        with pytest.raises(RuntimeError, match=f"{name}: this DDPMPipeline's components are streamed by torch_pins"):
            getattr(pipe, name)()
    with pytest.raises(ValueError, match="got device 'cuda'"):
        pipe.to("cuda")
    pipe.to("cpu")
    pipe.to(torch.float64)  # new tensors: pinned afresh
    plain = ddpm().to(torch.float64)
    assert pipe.unet.dtype == torch.float64
    assert torch.equal(run(pipe), run(plain))


def test_offloaded_pipelines_are_refused(pins, pd):
    from diffusers.hooks import apply_group_offloading
    pipe = ddpm()
    apply_group_offloading(pipe.unet, onload_device=torch.device("cpu"), offload_type="leaf_level")
    with pytest.raises(ValueError, match="DDPMPipeline.unet.* has diffusers' group offloading"):
        pins.diffusers.enable(pipe)
    pipe = ddpm()
    pipe.unet.conv_in._hf_hook = object()
    with pytest.raises(ValueError, match="DDPMPipeline.unet.conv_in has accelerate's offload hook"):
        pins.diffusers.enable(pipe)
    with pytest.raises(ValueError, match="pipe must be a diffusers DiffusionPipeline, got UNet2DModel"):
        pins.diffusers.enable(ddpm().unet)
    with pytest.raises(ValueError, match="level must be one of block, leaf, got 'all'"):
        pins.diffusers.enable(ddpm(), level="all")


def test_a_replaced_component_is_streamed_at_the_next_call(pins, pd):
    pipe = ddpm()
    state = pins.diffusers.enable(pipe)
    old = pipe.unet
    pipe.unet = ddpm(seed=1).unet
    assert torch.equal(run(pipe), run(ddpm(seed=1)))
    assert pd.pins_nn.streaming(old) is None and state.components["unet"] is pd.pins_nn.streaming(pipe.unet)


def test_pipelines_sharing_a_component_share_its_streaming(pins, pd):
    from diffusers import DDIMPipeline
    pipe = ddpm()
    other = DDIMPipeline.from_pipe(pipe)
    a, b = pins.diffusers.enable(pipe), pins.diffusers.enable(other)
    assert a.components["unet"] is b.components["unet"]
    run(pipe), run(other)
    pins.diffusers.disable(pipe)
    assert pd.pins_nn.streaming(other.unet) is b.components["unet"], "still streamed for the other pipeline"
    run(other)
    pins.diffusers.disable(other)
    assert pd.pins_nn.streaming(other.unet) is None


def test_without_diffusers_the_import_says_how_to_install_it():
    code = ("import sys; sys.modules['diffusers'] = None\n"
            "try:\n    import torch_pins.diffusers\nexcept ImportError as e:\n    print(e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "torch_pins.diffusers needs diffusers" in out.stdout and "pip install diffusers" in out.stdout, out


ALTERNATING = r"""
import json, sys, torch
sys.path.insert(0, {here!r})
import torch_pins as pins
from diffusers_pipelines import ddpm, dit, run
a, b = ddpm(width=32), dit(width=32, layers=4)
want = {{"a": run(a), "b": run(b)}}
sa, sb = pins.diffusers.enable(a), pins.diffusers.enable(b)
report = {{}}
for policy in ("mru", "trace"):
    pins.configure(policy=policy)
    for m in sa.models + sb.models:
        pins.invalidate_model(m)
    rows = []
    for i in range(6):
        name, pipe, state = ("a", a, sa) if i % 2 == 0 else ("b", b, sb)
        before = pins.stats()
        assert torch.equal(run(pipe), want[name])
        after = pins.stats()
        mine = lambda key, models: sum(after[f"model.{{m}}.{{key}}"] - before[f"model.{{m}}.{{key}}"] for m in models)
        rows.append(dict(pipe=name, hit_bytes=mine("hit_bytes", state.models),
                         miss_bytes=mine("miss_bytes", state.models), refused=mine("bypassed.pool", state.models),
                         evictions=after["evictions"] - before["evictions"],
                         pins={{n: sum(after[f"model.{{m}}.pins"] for m in s.models) for n, s in (("a", sa), ("b", sb))}}))
    report[policy] = rows
bytes_of = lambda p: sum(t.nbytes for c in p.components.values() if isinstance(c, torch.nn.Module)
                         for t in list(c.parameters()) + list(c.buffers()))
print(json.dumps(dict(report=report, a=bytes_of(a), b=bytes_of(b), peak=pins.stats()["pool_committed_peak_bytes"])))
"""


def test_two_pipelines_alternate_under_a_cap_smaller_than_both():
    """A DDPM and a DiT pipeline in one process, called in turn, under a cap on
    pins' memory that holds either one and not both, with the mru and the trace
    policy: pins never passes the cap, keeps the pins it holds (the pipeline
    pinned first keeps all of its own), serves the rest from the sources, and
    reads no more for it at each turn."""
    cap = 9 << 19  # 4.5 MiB
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_bindings"),
               PINS_CONF=f"cap:{cap},extent_min:64K,prewarm:false")
    out = subprocess.run([sys.executable, "-c", ALTERNATING.format(here=HERE)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(r)
    assert max(r["a"], r["b"]) < cap < r["a"] + r["b"], "each pipeline fits, both do not"
    assert r["peak"] <= cap
    for policy, rows in r["report"].items():
        a_rows = [row for row in rows if row["pipe"] == "a"]
        b_rows = [row for row in rows if row["pipe"] == "b"]
        assert a_rows[0]["miss_bytes"] > 0, policy
        assert all(row["miss_bytes"] == 0 and row["hit_bytes"] > 0 for row in a_rows[1:]), (policy, a_rows)
        for row in b_rows[1:]:
            assert 0 < row["miss_bytes"] and row["hit_bytes"] > 0 and row["refused"] > 0, (policy, row)
            assert row["miss_bytes"] == b_rows[1]["miss_bytes"] and row["pins"] == b_rows[1]["pins"], \
                (policy, "no churn", b_rows)


def test_the_ram_benchmark_shows_pins_holding_file_weights_once(tmp_path):
    """profiling/bench_diffusers_ram.py, small: with the UNet's weights from
    pins.load_file, pins holds them once (its pool, about their bytes) and the
    file's pages are not held besides (pins reads the file, not the mapping)."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_diffusers_ram.py"), "--width", "128",
                          "--modes", "pins-file", "--calls", "1", "--steps", "1"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in out.stdout.splitlines()
            if line.split() and line.split()[0] == "pins-file"}
    weights, held, peak, anon, file, pinned = rows["pins-file"][:6]
    assert weights > 30 and weights <= pinned <= weights * 1.1 + 4, rows  # MiB: the weights once, in pins' pool
    assert file < weights / 2, rows
    assert out.stdout.strip().splitlines()[-1] == "RESULT ram_pins_file_vs_plain=n/a", "no plain run to compare"
