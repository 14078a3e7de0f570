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
want = {{"a": run(a, steps=1), "b": run(b, steps=1)}}
sa, sb = pins.diffusers.enable(a), pins.diffusers.enable(b)
report = {{}}
for policy in ("mru", "trace"):
    pins.configure(policy=policy)
    for m in sa.models + sb.models:
        pins.invalidate_model(m)
    rows = []
    for i in range(6):
        name, pipe, state, other = ("a", a, sa, sb) if i % 2 == 0 else ("b", b, sb, sa)
        before = pins.stats()
        assert torch.equal(run(pipe, steps=1), want[name])
        after = pins.stats()
        mine = lambda key, models: sum(after[f"model.{{m}}.{{key}}"] - before[f"model.{{m}}.{{key}}"] for m in models)
        rows.append(dict(pipe=name, hit_bytes=mine("hit_bytes", state.models),
                         miss_bytes=mine("miss_bytes", state.models), refused=mine("bypassed.refused", state.models),
                         pool=mine("bypassed.pool", state.models), own_evictions=mine("evictions", state.models),
                         evictions=mine("evictions", other.models),
                         held={{n: sum(after[f"model.{{m}}.bytes"] for m in s.models) for n, s in (("a", sa), ("b", sb))}}))
    report[policy] = rows
bytes_of = lambda p: sum(t.nbytes for c in p.components.values() if isinstance(c, torch.nn.Module)
                         for t in list(c.parameters()) + list(c.buffers()))
print(json.dumps(dict(report=report, a=bytes_of(a), b=bytes_of(b), peak=pins.stats()["pool_committed_peak_bytes"])))
"""


def test_two_pipelines_alternate_under_a_cap_smaller_than_both():
    """A DDPM and a DiT pipeline in one process, called in turn (one sampler
    step: each weight read once a call), under a cap on pins' memory that holds
    either one and not both. The cap is a budget the policy chooses under
    (Note [Cap budget]), as pins-sim's SimCli.ACapIsABudgetThePoliciesChooseUnder
    predicts for this pattern: mru takes the other pipeline's newest pins at
    every call, so each call reads again what the call before took; the trace,
    once it has both pipelines' records, keeps the pins of the pipeline that
    comes next and refuses the first one's missing pins instead (Note [Trace
    bypass]): nothing is evicted, the second pipeline hits everything and the
    first reads the same bytes every turn, less in all than mru reads."""
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
    used = lambda row: row["hit_bytes"] + row["miss_bytes"]  # each weight the call reads, once
    for policy, rows in r["report"].items():
        # The balancer frees for the cap: the pool refuses nothing. The first
        # call pins all of a; the second takes a's pins for what b lacks (the
        # trace has no record of b yet: mru's order).
        assert all(row["pool"] == 0 for row in rows), (policy, rows)
        assert rows[0]["hit_bytes"] == 0 and rows[0]["held"]["a"] == used(rows[0]), (policy, rows[0])
        assert rows[1]["evictions"] > 0 and rows[1]["refused"] == 0 and rows[1]["held"]["b"] == used(rows[1]), \
            (policy, rows[1])
        assert all(row["own_evictions"] == 0 for row in rows), (policy, "another pipeline's pins go first", rows)
    mru, trace = r["report"]["mru"], r["report"]["trace"]
    for i, row in enumerate(mru[2:], 2):
        # Each call finds its newest pins taken, reads them, and takes the
        # other's newest: it ends holding all of its own, and it reads what it
        # read two calls ago.
        assert row["miss_bytes"] > 0 and row["hit_bytes"] > 0 and row["evictions"] > 0, ("mru", i, row)
        assert row["refused"] == 0 and row["held"][row["pipe"]] == used(row), ("mru", i, row)
        if i >= 4:
            assert row["miss_bytes"] == mru[i - 2]["miss_bytes"], ("mru", "a period of two calls", mru)
    # From the third call the trace follows both records: nothing is evicted,
    # so what each holds stays as the third call left it (a's pins being what
    # fits beside all of b's). b hits everything; a, from its next turn on,
    # hits what it holds and reads the rest, the same bytes every turn.
    held = trace[2]["held"]
    for i, row in enumerate(trace[2:], 2):
        assert row["evictions"] == 0 and row["held"] == held, ("trace: no churn", i, trace)
        if row["pipe"] == "b":
            assert row["miss_bytes"] == 0 and row["hit_bytes"] == held["b"], ("trace: b keeps its pins", row)
        else:
            assert row["refused"] > 0, ("trace: a's missing pins are refused, not b's taken", row)
            if i >= 4:
                assert row["hit_bytes"] == held["a"] and row["miss_bytes"] == used(row) - held["a"], ("trace", row)
    # a holds at least what it holds under mru after b's call (both beside all
    # of b's), so it reads at most what mru's a reads; b reads nothing.
    assert trace[4]["miss_bytes"] <= mru[4]["miss_bytes"], (trace, mru)
    assert trace[4]["miss_bytes"] + trace[5]["miss_bytes"] < mru[4]["miss_bytes"] + mru[5]["miss_bytes"], (trace, mru)


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
