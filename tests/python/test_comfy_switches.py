"""ComfyUI's own switches and budgets with pins on (issue 37), against the
stand-ins of test_comfy_standins.py: --disable-pinned-memory and --fast-disk,
the page-lock cap (ensure_pin_registerable), 0.3.64's offload stream, one
gathered transfer per layer under dynamic VRAM, lowvram LoRA patches, the log
prefix. test_comfy_switches_comfyui.py checks the same against a real ComfyUI."""
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
