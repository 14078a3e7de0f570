"""ComfyUI's own switches and budgets with pins on (issue 37), against a real
ComfyUI on the CPU (COMFYUI_PATH, as test_comfy.py, whose nodes and fixtures
these use): --disable-pinned-memory, --fast-disk and lowvram LoRA patches under
dynamic VRAM, the page-lock cap's evict_active, 0.3.64's offload stream.
test_comfy_switches.py checks the same against stand-ins, in CI."""
import os

import pytest
import torch

from test_comfy import (PROMPTS, STEPS, _FakeCudart, _dynamic_net, _graph, _has_dynamic_vram,  # noqa: F401
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
