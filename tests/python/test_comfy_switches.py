"""ComfyUI's own switches and budgets with pins on (issue 37), against the
stand-ins of test_comfy_standins.py: --disable-pinned-memory and --fast-disk,
the page-lock cap (ensure_pin_registerable), 0.3.64's offload stream, one
gathered transfer per layer under dynamic VRAM, the log prefix. test_comfy.py
checks the same against a real ComfyUI."""
import logging
import sys
import types

import pytest
import torch

from test_comfy_standins import _net_and_patcher, _with_vbar_path, comfy_env  # noqa: F401  (a fixture)


def _args(monkeypatch, **flags):
    cli_args = types.ModuleType("comfy.cli_args")
    cli_args.args = types.SimpleNamespace(**{"cpu": False, "disable_pinned_memory": False, "fast_disk": False,
                                             **flags})
    monkeypatch.setitem(sys.modules, "comfy.cli_args", cli_args)
    return cli_args.args


def test_disable_pinned_memory_leaves_pins_out_and_says_so(comfy_env, monkeypatch, caplog):
    _args(monkeypatch, disable_pinned_memory=True)
    with caplog.at_level(logging.INFO, logger="torch_pins.comfy"):
        hooks = comfy_env.integration.enable(cpu_targets=True)
    assert not hooks and "--disable-pinned-memory" in hooks.reason
    net, _ = _net_and_patcher(comfy_env)
    net(torch.randn(2, 8))
    assert comfy_env.pins.stats()["pins"] == 0, "--disable-pinned-memory: no pin at all"
    s = comfy_env.integration.stats()
    assert s["enabled"] is False and "--disable-pinned-memory" in s["why"]
    info = [r.getMessage() for r in caplog.records if "hooks in" in r.getMessage()]
    assert len(info) == 1 and "--disable-pinned-memory: pins pins nothing" in info[0], info


def test_fast_disk_registers_models_without_loaded_pins(comfy_env, monkeypatch, caplog):
    _args(monkeypatch, fast_disk=True)
    vbar = _with_vbar_path(comfy_env)
    try:
        with caplog.at_level(logging.INFO, logger="torch_pins.comfy"):
            assert comfy_env.integration.enable(cpu_targets=True)
        net, patcher = _net_and_patcher(comfy_env)
        model = comfy_env.integration.model_id(patcher)
        for _ in range(2):
            w, b = vbar.cast_layer(net.l1, True)  # resident: a weights-loaded pin without --fast-disk
            assert torch.equal(w, net.l1.weight) and torch.equal(b, net.l1.bias)
    finally:
        del sys.modules["comfy.pinned_memory"], sys.modules["comfy.memory_management"]
    s = comfy_env.pins.stats()
    assert s[f"model.{model}.fast_disk"] == 1
    assert s[f"model.{model}.weights-loaded.pins"] == 0 and s["pins"] == 0, "--fast-disk: loaded weights unpinned"
    assert vbar.comfy_pins == {}
    info = [r.getMessage() for r in caplog.records if "hooks in" in r.getMessage()]
    assert "--fast-disk: no pin of a loaded weight" in info[0], info


def _with_page_lock_cap(env, monkeypatch, cap):
    """ComfyUI 0.33's page-lock cap (MAX_PINNED_MEMORY, TOTAL_PINNED_MEMORY,
    ensure_pin_registerable) and its prefetcher's call: the registerable size of
    every prefetched layer, after they were cast."""
    mm = env.m["comfy.model_management"]
    mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY, mm.registrations_freed = cap, 0, []

    def ensure_pin_registerable(size, evict_active=True):
        over = mm.TOTAL_PINNED_MEMORY + size - mm.MAX_PINNED_MEMORY
        mm.registrations_freed.append((max(over, 0), evict_active))

    mm.ensure_pin_registerable = ensure_pin_registerable
    # A GPU's page-locked bytes: on this CPU machine pins page-locks nothing.
    monkeypatch.setattr(env.rec, "locked_bytes", lambda: env.pins.stats()["pinned_bytes"], raising=False)
    return mm


def _layer_size(s):
    return sum((t.numel() * t.element_size() + 1023) // 1024 * 1024 for t in (s.weight, s.bias) if t is not None)


def test_the_page_lock_cap_counts_the_layers_pins_serves_once(comfy_env, monkeypatch):
    vbar = _with_vbar_path(comfy_env)
    prefetch = types.ModuleType("comfy.model_prefetch")
    monkeypatch.setitem(sys.modules, "comfy.model_prefetch", prefetch)
    try:
        net, patcher = None, None

        def prefetch_queue_pop(layers):  # 0.33's: cast the layers, then ask room for all of them
            for s in layers:
                vbar.cast_layer(s, False)
            comfy_env.m["comfy.model_management"].ensure_pin_registerable(sum(_layer_size(s) for s in layers))

        prefetch.prefetch_queue_pop = prefetch_queue_pop
        mm = _with_page_lock_cap(comfy_env, monkeypatch, cap=0)
        comfy_env.integration.enable(cpu_targets=True)
        net, patcher = _net_and_patcher(comfy_env)
        layers = [net.l1, net.l2]
        mm.MAX_PINNED_MEMORY = sum(_layer_size(s) for s in layers) + 4096
        for _ in range(3):
            prefetch.prefetch_queue_pop(layers)
    finally:
        del sys.modules["comfy.pinned_memory"], sys.modules["comfy.memory_management"]
    assert comfy_env.pins.stats()["pins"] == 2, "the pins just served stay"
    assert "free_pins" not in comfy_env.rec.names(), comfy_env.rec.calls[-3:]
    assert mm.registrations_freed == [(0, True)] * 3, "ComfyUI registers none of them: it makes no room"


def test_ensure_pin_registerable_passes_a_positional_evict_active_on(comfy_env, monkeypatch):
    mm = _with_page_lock_cap(comfy_env, monkeypatch, cap=0)
    comfy_env.integration.enable(cpu_targets=True)
    net, _ = _net_and_patcher(comfy_env)
    net(torch.randn(2, 8))  # pins: the cap is full
    mm.MAX_PINNED_MEMORY = comfy_env.pins.stats()["pinned_bytes"]
    mm.ensure_pin_registerable(4096, False)
    frees = [c for c in comfy_env.rec.calls if c[0] == "free_pins"]
    assert frees and all(c[1][1] is False for c in frees), frees
    assert mm.registrations_freed[-1][1] is False


def _with_offload_streams(env, offloadable_param):
    """comfy.ops.cast_bias_weight as 0.3.64's (no `offloadable`: it takes an
    offload stream for every cast) or 0.33's, a counting get_offload_stream."""
    mm, ops = env.m["comfy.model_management"], env.m["comfy.ops"]
    mm.streams_taken, mm.synced, entered = [], [], []

    class Stream:
        def __init__(self, n):
            self.n = n

        def __enter__(self):
            entered.append(self.n)

        def __exit__(self, *exc):
            entered.pop()

    def get_offload_stream(device):
        mm.streams_taken.append(len(mm.streams_taken))
        return Stream(len(mm.streams_taken) - 1)

    def sync_stream(device, stream):
        mm.synced.append(stream.n if stream is not None else None)

    plain = ops.cast_bias_weight

    def cast_bias_weight_064(s, input=None, dtype=None, device=None, bias_dtype=None):
        stream = mm.get_offload_stream(device if device is not None else input.device)
        with stream:
            w, b = plain(s, input, dtype, device, bias_dtype)
        mm.sync_stream(w.device, stream)
        return w, b

    def cast_bias_weight_033(s, input=None, dtype=None, device=None, bias_dtype=None, offloadable=False):
        if not offloadable:
            return plain(s, input, dtype, device, bias_dtype)
        stream = mm.get_offload_stream(device if device is not None else input.device)
        with stream:
            w, b = plain(s, input, dtype, device, bias_dtype)
        return w, b, (stream, w, b)

    mm.get_offload_stream, mm.sync_stream = get_offload_stream, sync_stream
    ops.cast_bias_weight = cast_bias_weight_033 if offloadable_param else cast_bias_weight_064
    real_cast = env.rec.cast_many_to_device

    def cast_many(*args, **kwargs):
        env.seen_streams.append(list(entered))
        return real_cast(*args, **kwargs)

    env.seen_streams = []
    return mm, cast_many


def test_async_offload_of_0_3_64_casts_on_comfyuis_offload_stream(comfy_env, monkeypatch):
    mm, cast_many = _with_offload_streams(comfy_env, offloadable_param=False)
    comfy_env.integration.enable(cpu_targets=True)
    monkeypatch.setattr(comfy_env.rec, "cast_many_to_device", cast_many, raising=False)
    net, _ = _net_and_patcher(comfy_env)
    net.l1(torch.randn(2, 8))
    assert comfy_env.seen_streams == [[0]], "pins' copy runs on the stream ComfyUI took"
    assert mm.streams_taken == [0] and mm.synced == [0], "one stream taken, then synced, as ComfyUI does"


@pytest.mark.parametrize("offloadable_param", [False, True], ids=["0.3.64", "0.33"])
def test_a_cast_pins_does_not_serve_takes_one_offload_stream(comfy_env, offloadable_param):
    mm, _ = _with_offload_streams(comfy_env, offloadable_param)
    comfy_env.integration.enable(cpu_targets=True)
    layer = comfy_env.m["comfy.ops"].Linear(8, 4)  # no patcher: ComfyUI's own cast
    kwargs = {"offloadable": True} if offloadable_param else {}
    comfy_env.m["comfy.ops"].cast_bias_weight(layer, torch.randn(2, 8), **kwargs)
    assert mm.streams_taken == [0], "the fallback takes ComfyUI's next stream once, not twice"


def test_a_dynamic_layer_is_one_pin_and_one_transfer(comfy_env):
    vbar = _with_vbar_path(comfy_env)
    try:
        comfy_env.integration.enable(cpu_targets=True)
        net, patcher = _net_and_patcher(comfy_env)
        model = comfy_env.integration.model_id(patcher)
        comfy_env.rec.calls.clear()
        for _ in range(3):
            w, b = vbar.cast_layer(net.l1, False)
            assert torch.equal(w, net.l1.weight) and torch.equal(b, net.l1.bias)
    finally:
        del sys.modules["comfy.pinned_memory"], sys.modules["comfy.memory_management"]
    s = comfy_env.pins.stats()
    assert s[f"model.{model}.weights.pins"] == 1, "weight and bias in one gathered pin"
    assert (s[f"model.{model}.weights.misses"], s[f"model.{model}.weights.hits"]) == (1, 2)
    casts = [c[0] for c in comfy_env.rec.calls if c[0].startswith("cast_")]
    assert casts == ["cast_many_to_device"] * 3, casts


class _LowVramPatch:
    """ComfyUI 0.33's LowVramPatch as far as the cast path looks: a key, the
    patcher's patches, is_lowvram_patch, memory_required."""
    is_lowvram_patch = True

    def __init__(self, key, patches):
        self.key, self.patches = key, patches

    def memory_required(self):
        return sum(t.nbytes for t in self.patches[self.key][0][1])


def test_a_lowvram_lora_patch_of_a_dynamic_layer_is_pinned_by_pins(comfy_env):
    vbar = _with_vbar_path(comfy_env)
    pinned, mm = sys.modules["comfy.pinned_memory"], comfy_env.m["comfy.model_management"]
    try:
        comfy_env.integration.enable(cpu_targets=True)
        net, patcher = _net_and_patcher(comfy_env)
        g = torch.Generator().manual_seed(3)
        factors = (torch.randn(16, 2, generator=g), torch.randn(2, 8, generator=g))
        patch = _LowVramPatch("l1.weight", {"l1.weight": [(1.0, factors, 1.0, None, None)]})
        for _ in range(2):  # cast_modules_with_vbar: the layer, then its lowvram patch into a cast buffer
            vbar.cast_layer(net.l1, False)
            dest = torch.empty(2 * 1024, dtype=torch.uint8)
            assert pinned.get_pin(patch, subset="patches") is None
            pinned.pin_memory(patch, subset="patches", size=patch.memory_required())
            assert pinned.get_pin(patch, subset="patches") is None
            offset = 0
            for t in factors:  # comfy.lora.prefetch_prepared_value, copy=True
                mm.cast_to_gathered([t], dest[offset:offset + 1024], non_blocking=True)
                view = dest[offset:offset + t.nbytes].view(t.dtype).view(t.shape)
                assert torch.equal(view, t)
                offset += 1024
    finally:
        del sys.modules["comfy.pinned_memory"], sys.modules["comfy.memory_management"]
    assert vbar.comfy_pins == {}, "ComfyUI pinned neither the layer nor its patch"
    model = comfy_env.integration.model_id(patcher)
    s = comfy_env.pins.stats()
    assert [s[f"model.{model}.patches.{k}"] for k in ("pins", "misses", "hits")] == [2, 2, 2], s
    assert comfy_env.integration.stats()["vbar_patch_casts"] == 4


def test_log_lines_carry_the_prefix_once(comfy_env, caplog):
    comfy_env.m["comfy.model_management"].cast_to_gathered = None  # missing: a warning
    with caplog.at_level(logging.DEBUG, logger="torch_pins.comfy"):
        comfy_env.integration.enable()
    for r in caplog.records:
        line = f"{r.name}: {r.getMessage()}"
        assert "torch_pins.comfy: torch_pins.comfy:" not in line, line


# --- the same against a real ComfyUI (COMFYUI_PATH, as test_comfy.py) ----------

import os  # noqa: E402

from test_comfy import (PROMPTS, STEPS, _FakeCudart, _dynamic_net, _graph, _has_dynamic_vram,  # noqa: E402,F401
                        _run, _vbar_forward, _write_weights, comfyui, integration)

real = pytest.mark.skipif(not os.environ.get("COMFYUI_PATH"),
                          reason="COMFYUI_PATH is not set: a ComfyUI checkout (scripts/comfyui_checkout.sh)")


@real
def test_comfyui_with_disable_pinned_memory_pins_nothing(comfyui, integration, pins, monkeypatch, tmp_path):
    import comfy.cli_args

    if not hasattr(comfy.cli_args.args, "disable_pinned_memory"):
        pytest.skip("this ComfyUI has no --disable-pinned-memory")
    monkeypatch.setattr(comfy.cli_args.args, "disable_pinned_memory", True)
    weights = _write_weights(tmp_path / "model.safetensors", 5)
    hooks = integration.enable(cpu_targets=True)
    assert not hooks and "--disable-pinned-memory" in hooks.reason
    before = pins.stats()["pinned_bytes"]
    served = _run(comfyui, [_graph(weights, seed) for seed in range(PROMPTS)])
    assert served.model == -1 and pins.stats()["pinned_bytes"] == before == 0


@real
@pytest.mark.parametrize("vram_kib", [72, 16])
def test_comfyui_with_fast_disk_pins_what_comfyui_pins(comfyui, integration, pins, monkeypatch, tmp_path, vram_kib):
    """--fast-disk under dynamic VRAM: ComfyUI pins no layer that keeps a place
    in VRAM, only the streamed ones; with pins on, pins pins the same."""
    if not _has_dynamic_vram():
        pytest.skip("this ComfyUI predates dynamic VRAM (comfy.pinned_memory)")
    import comfy.cli_args
    import comfy.memory_management
    import comfy_aimdo.control
    import comfy_aimdo.model_vbar

    g = torch.Generator().manual_seed(11)
    path = str(tmp_path / "dyn.safetensors")
    comfyui.utils.save_torch_file({f"layers.{i}.{k}": (torch.randn(*shape, generator=g) / 8).half()
                                   for i in range(3) for k, shape in (("weight", (128, 128)), ("bias", (128,)))},
                                  path)
    comfy_aimdo.control.init()
    comfy_aimdo.control.init_devices([0])
    comfy_aimdo.model_vbar.configure(vram_bytes=vram_kib * 1024, page_size=4096)
    monkeypatch.setattr(comfy.memory_management, "aimdo_enabled", True)
    monkeypatch.setattr(comfy.cli_args.args, "fast_disk", True)
    monkeypatch.setattr(comfyui.mm, "MAX_PINNED_MEMORY", 1 << 30)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart())
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    x = torch.randn(4, 128, generator=g)

    def run():
        net = _dynamic_net(comfyui, path)
        patcher = comfyui.mp.ModelPatcherDynamic(net, load_device=gpu, offload_device=cpu)
        patcher.partially_load(gpu)
        before = comfyui.mm.TOTAL_PINNED_MEMORY
        with torch.no_grad():
            outs = [_vbar_forward(comfyui, net, x) for _ in range(2)]
        pinned = comfyui.mm.TOTAL_PINNED_MEMORY - before
        patcher.partially_unload_ram(1e30)
        return outs, pinned, patcher

    plain, comfy_pinned, _ = run()
    hooks = integration.enable(cpu_targets=True)
    assert hooks.active
    served, _, patcher = run()
    assert all(torch.equal(a, b) for a, b in zip(plain, served))
    s = pins.stats()
    model = integration.model_id(patcher)
    assert s[f"model.{model}.weights-loaded.pins"] == 0, "--fast-disk: no pin of a layer kept in VRAM"
    streamed = s[f"model.{model}.weights.pins"]
    assert streamed * 33792 == comfy_pinned, (streamed, comfy_pinned)  # the layers ComfyUI pins, one pin each


@real
def test_comfyuis_ensure_pin_registerable_passes_a_positional_evict_active_on(comfyui, integration, pins,
                                                                             monkeypatch, tmp_path):
    if not hasattr(comfyui.mm, "ensure_pin_registerable"):
        pytest.skip("this ComfyUI has no page-lock cap (ensure_pin_registerable)")
    assert integration.enable(cpu_targets=True)
    locked, calls = 1 << 20, []
    real_free = pins.free_pins
    monkeypatch.setattr(pins, "locked_bytes", lambda: locked)  # a GPU's: pins page-locks its pins
    monkeypatch.setattr(pins, "free_pins", lambda *a: calls.append(a) or real_free(*a))
    monkeypatch.setattr(comfyui.mm, "MAX_PINNED_MEMORY", locked)
    monkeypatch.setattr(comfyui.mm, "TOTAL_PINNED_MEMORY", 0)
    comfyui.mm.ensure_pin_registerable(4096, False)
    assert calls and all(a[1] is False for a in calls), calls


@real
def test_comfyui_0_3_64_async_offload_casts_on_its_offload_stream(comfyui, integration, pins, monkeypatch, tmp_path):
    import inspect

    if "offloadable" in inspect.signature(comfyui.ops.cast_bias_weight).parameters:
        pytest.skip("0.33 takes an offload stream only for an offloadable caller (the stand-ins test it)")
    entered, taken, synced, seen = [], [], [], []

    class Stream:  # what get_offload_stream returns on a GPU with --async-offload
        def __enter__(self):
            entered.append(self)

        def __exit__(self, *exc):
            entered.pop()

    monkeypatch.setattr(comfyui.mm, "get_offload_stream", lambda device: taken.append(Stream()) or taken[-1])
    monkeypatch.setattr(comfyui.mm, "sync_stream", lambda device, stream: synced.append(stream))
    real_many = pins.cast_many_to_device
    monkeypatch.setattr(pins, "cast_many_to_device",
                        lambda *a, **k: seen.append(list(entered)) or real_many(*a, **k))
    weights = _write_weights(tmp_path / "model.safetensors", 8)
    assert integration.enable(cpu_targets=True)
    _run(comfyui, [_graph(weights, 0)])
    s = integration.stats()
    assert s["casts"] == STEPS * 4 and s.get("errors", 0) == 0, s
    assert len(seen) == STEPS * 3 and all(len(x) == 1 for x in seen), "each gathered copy on ComfyUI's stream"
    assert len(taken) == STEPS * 4 and synced == taken, "one stream a cast, synced as ComfyUI syncs it"


@real
@pytest.mark.parametrize("vram_kib", [72, 16])
def test_comfyuis_lowvram_lora_patches_are_pinned_by_pins_under_dynamic_vram(comfyui, integration, pins,
                                                                              monkeypatch, tmp_path, vram_kib):
    """LowVramPatch sources (LoRA factors) of the layers pins serves: one pool,
    pins' patches subsets; ComfyUI pins none of them itself."""
    if not _has_dynamic_vram():
        pytest.skip("this ComfyUI predates dynamic VRAM (comfy.pinned_memory)")
    import comfy.memory_management
    import comfy_aimdo.control
    import comfy_aimdo.model_vbar

    g = torch.Generator().manual_seed(13)
    path, lora_path = str(tmp_path / "dyn.safetensors"), str(tmp_path / "lora.safetensors")
    comfyui.utils.save_torch_file({f"layers.{i}.{k}": (torch.randn(*shape, generator=g) / 8).half()
                                   for i in range(3) for k, shape in (("weight", (128, 128)), ("bias", (128,)))},
                                  path)
    lora = {}
    for i in range(3):
        lora[f"lora.layers_{i}.lora_up.weight"] = (torch.randn(128, 4, generator=g) / 10).half()
        lora[f"lora.layers_{i}.lora_down.weight"] = (torch.randn(4, 128, generator=g) / 10).half()
    comfyui.utils.save_torch_file(lora, lora_path)
    key_map = {f"lora.layers_{i}": f"layers.{i}.weight" for i in range(3)}
    comfy_aimdo.control.init()
    comfy_aimdo.control.init_devices([0])
    comfy_aimdo.model_vbar.configure(vram_bytes=vram_kib * 1024, page_size=4096)
    monkeypatch.setattr(comfy.memory_management, "aimdo_enabled", True)
    monkeypatch.setattr(comfyui.mm, "MAX_PINNED_MEMORY", 1 << 30)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart())
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    x = torch.randn(4, 128, generator=g)

    def run():
        net = _dynamic_net(comfyui, path)
        patcher = comfyui.mp.ModelPatcherDynamic(net, load_device=gpu, offload_device=cpu)
        patcher.add_patches(comfyui.lora.load_lora(comfyui.utils.load_torch_file(lora_path), key_map), 1.0)
        patcher.partially_load(gpu)
        assert all(s.weight_lowvram_function is not None for s in net.layers)
        before = comfyui.mm.TOTAL_PINNED_MEMORY
        with torch.no_grad():
            outs = [_vbar_forward(comfyui, net, x) for _ in range(2)]
        pinned = comfyui.mm.TOTAL_PINNED_MEMORY - before
        patcher.partially_unload_ram(1e30)
        return outs, pinned, patcher

    plain, comfy_pinned, _ = run()
    assert comfy_pinned > 0, "ComfyUI pins layers and patches itself"
    assert integration.enable(cpu_targets=True)
    served, comfy_pinned, patcher = run()
    assert all(torch.equal(a, b) for a, b in zip(plain, served)), "pins changed an output"
    assert comfy_pinned == 0, "ComfyUI pinned nothing of its own: one pool"
    s, model = pins.stats(), integration.model_id(patcher)
    patch_pins = s[f"model.{model}.patches.pins"] + s[f"model.{model}.patches-loaded.pins"]
    assert patch_pins == 3 * 2, s  # each layer's up and down factor
    casts = integration.stats()
    assert casts["vbar_patch_casts"] >= 3 * 2 and casts.get("errors", 0) == 0, casts
