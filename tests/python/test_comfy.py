"""torch_pins.comfy against a real ComfyUI checkout, on the CPU.

Set COMFYUI_PATH to a checkout (scripts/comfyui_checkout.sh makes one and
installs what these tests import); without it every test here is skipped.

Prompts run through ComfyUI's own executor (execution.PromptExecutor, which
runs every node inside torch.inference_mode()) with three small nodes defined
here: a loader (weights written to a safetensors file, read back with
comfy.utils.load_torch_file into a model of comfy.ops.manual_cast layers, fp16
weights, fp32 compute, wrapped in a ModelPatcher), a LoRA node (comfy.lora.load_lora
and ModelPatcher.add_patches, as ComfyUI's LoraLoaderModelOnly does) and a
sampler that loads the model with comfy.model_management.load_models_gpu and runs
4 steps. Each scenario runs once on plain ComfyUI and once with pins; outputs
must be bit-identical.
"""
import functools
import gc
import importlib
import inspect
import logging
import importlib.machinery
import os
import sys
import types
import uuid

import pytest
import torch

COMFYUI_PATH = os.environ.get("COMFYUI_PATH")
pytestmark = pytest.mark.skipif(
    not COMFYUI_PATH,
    reason="COMFYUI_PATH is not set: these tests need a ComfyUI checkout (scripts/comfyui_checkout.sh)")

STEPS = 4
PROMPTS = 3
# Packages ComfyUI imports at module level that the CPU build of torch here
# cannot have (PyPI's torchvision does not load beside this torch): stood in by
# empty modules when missing; no code path used here calls them.
OPTIONAL_IMPORTS = ["torchvision", "torchvision.transforms", "torchvision.transforms.functional", "torchvision.ops",
                    "torchaudio", "torchaudio.transforms", "torchaudio.functional"]
# Names newer ComfyUI (0.33) takes from them at import (comfy.model_base).
OPTIONAL_NAMES = {"torchvision.ops": ["roi_align", "deform_conv2d"]}
# comfy-aimdo, which ComfyUI 0.33 imports everywhere and which needs a GPU: the
# stand-in of tests/python/standins (its README) wins over an installed one.
STANDINS = os.path.join(os.path.dirname(__file__), "standins")


@pytest.fixture(scope="module")
def comfyui():
    """ComfyUI imported on the CPU; its path, the stand-in modules and the test
    nodes removed again afterwards."""
    added_path = COMFYUI_PATH not in sys.path
    if added_path:
        sys.path.insert(0, COMFYUI_PATH)
    sys.path.insert(0, STANDINS)
    stubs = []
    for name in OPTIONAL_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            for attr in OPTIONAL_NAMES.get(name, ()):
                setattr(module, attr, None)
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
            stubs.append(name)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    import comfy.model_management
    import comfy.model_patcher
    import comfy.ops
    import comfy.utils
    import comfy.lora
    import comfy.patcher_extension
    import execution
    import nodes

    assert comfy.model_management.get_torch_device() == torch.device("cpu")
    ns = types.SimpleNamespace(mm=comfy.model_management, mp=comfy.model_patcher, ops=comfy.ops,
                               patcher_extension=comfy.patcher_extension,
                               utils=comfy.utils, lora=comfy.lora, execution=execution, nodes=nodes)
    test_nodes = _test_nodes(ns)
    nodes.NODE_CLASS_MAPPINGS.update(test_nodes)
    yield ns
    RUN.clear()  # the last patcher, before ComfyUI's modules go at exit
    gc.collect()
    for name in test_nodes:
        nodes.NODE_CLASS_MAPPINGS.pop(name, None)
    for name in stubs:
        sys.modules.pop(name, None)
    sys.path.remove(STANDINS)
    if added_path:
        sys.path.remove(COMFYUI_PATH)


@pytest.fixture
def integration(comfyui, pins, monkeypatch):
    import torch_pins.comfy as integration

    monkeypatch.delenv(integration.ENV_VAR, raising=False)
    integration.disable()
    yield integration
    integration.disable()
    comfyui.mm.unload_all_models()


RUN = {}  # what the test nodes saw, read by the tests


def _tiny_net(ops):
    class TinyNet(torch.nn.Module):
        """A few of ComfyUI's manual_cast layers, fp16 weights, fp32 compute."""

        def __init__(self):
            super().__init__()
            dt = torch.float16
            self.proj_in = ops.manual_cast.Linear(32, 64, dtype=dt)
            self.norm = ops.manual_cast.GroupNorm(8, 64, dtype=dt)
            self.conv = ops.manual_cast.Conv2d(4, 4, 3, padding=1, dtype=dt)
            self.proj_out = ops.manual_cast.Linear(64, 32, bias=False, dtype=dt)

        def forward(self, x):
            h = self.norm(self.proj_in(x))
            h = self.conv(h.reshape(h.shape[0], 4, 4, 4)).reshape(h.shape[0], 64)
            return self.proj_out(torch.nn.functional.silu(h))

    return TinyNet


def _test_nodes(c):
    TinyNet = _tiny_net(c.ops)

    class PinsTestLoader:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"path": ("STRING", {"default": ""})}}

        RETURN_TYPES = ("MODEL",)
        FUNCTION = "load"
        CATEGORY = "testing"

        def load(self, path):
            sd = c.utils.load_torch_file(path)
            net = TinyNet()
            net.load_state_dict(sd)
            RUN["inference_weights"] = all(p.is_inference() for p in net.parameters())
            patcher = c.mp.ModelPatcher(net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
            RUN["patcher"] = patcher
            return (patcher,)

    class PinsTestLora:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"model": ("MODEL",), "path": ("STRING", {"default": ""}),
                                 "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0})}}

        RETURN_TYPES = ("MODEL",)
        FUNCTION = "apply"
        CATEGORY = "testing"

        def apply(self, model, path, strength):
            lora = c.utils.load_torch_file(path)
            key_map = {"lora.proj_in": "proj_in.weight", "lora.proj_out": "proj_out.weight"}
            patched = model.clone()
            patched.add_patches(c.lora.load_lora(lora, key_map), strength)
            return (patched,)

    class PinsTestSampler:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"model": ("MODEL",), "seed": ("INT", {"default": 0, "min": 0, "max": 1 << 30}),
                                 "lowvram": ("BOOLEAN", {"default": False})}}

        RETURN_TYPES = ("LATENT",)
        FUNCTION = "sample"
        CATEGORY = "testing"

        def sample(self, model, seed, lowvram):
            import torch_pins as pins

            c.mm.load_models_gpu([model])
            RUN.setdefault("loaded", []).append((model.loaded_size(), model.model_size(), pins.stats()))
            if lowvram:  # what ComfyUI does when VRAM runs short: stream the weights, patch on the fly
                model.partially_unload(model.offload_device, 1e30)
            x = torch.randn(2, 32, generator=torch.Generator().manual_seed(seed))
            for _ in range(STEPS):
                before = pins.stats()
                x = x + 0.25 * model.model(x)
                RUN.setdefault("steps", []).append((before, pins.stats()))
            return ({"samples": x},)

    class TinyBase(torch.nn.Module):
        """What ComfyUI's BaseModel is to a sampler: the network as
        ``diffusion_model`` (the key TorchCompileModel compiles) and
        ``apply_model`` running the patcher's APPLY_MODEL wrappers around it."""

        def __init__(self):
            super().__init__()
            self.diffusion_model = TinyNet()

        def apply_model(self, x, transformer_options):
            pe = c.patcher_extension
            wrappers = pe.get_all_wrappers(pe.WrappersMP.APPLY_MODEL, transformer_options)
            return pe.WrapperExecutor.new_class_executor(self._apply_model, self, wrappers).execute(
                x, transformer_options)

        def _apply_model(self, x, transformer_options):
            return self.diffusion_model(x)

    class PinsTestBaseLoader(PinsTestLoader):
        def load(self, path):
            sd = c.utils.load_torch_file(path)
            net = TinyBase()
            net.diffusion_model.load_state_dict(sd)
            patcher = c.mp.ModelPatcher(net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
            RUN["patcher"] = patcher
            return (patcher,)

    class PinsTestApplySampler(PinsTestSampler):
        """The sampler through apply_model, with the patcher's wrappers in
        transformer_options as ComfyUI's sampler_helpers puts them. ``run``
        changes nothing but the prompt: ComfyUI runs a prompt that differs from
        the last one only there again (an identical one it serves from its cache)."""

        @classmethod
        def INPUT_TYPES(cls):
            types_ = PinsTestSampler.INPUT_TYPES()
            types_["required"]["run"] = ("INT", {"default": 0, "min": 0, "max": 1 << 30})
            return types_

        def sample(self, model, seed, lowvram, run):
            import torch_pins as pins

            c.mm.load_models_gpu([model])
            options = {"wrappers": {k: {k1: list(w) for k1, w in v.items()} for k, v in model.wrappers.items()}}
            x = torch.randn(2, 32, generator=torch.Generator().manual_seed(seed))
            for _ in range(STEPS):
                before = pins.stats()
                x = x + 0.25 * model.model.apply_model(x, options)
                RUN.setdefault("steps", []).append((before, pins.stats()))
            return ({"samples": x},)

    class PinsTestOutput:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"samples": ("LATENT",)}}

        RETURN_TYPES = ()
        FUNCTION = "store"
        OUTPUT_NODE = True
        CATEGORY = "testing"

        def store(self, samples):
            RUN.setdefault("outputs", []).append(samples["samples"].clone())
            return {}

    found = {"PinsTestLoader": PinsTestLoader, "PinsTestLora": PinsTestLora, "PinsTestSampler": PinsTestSampler,
             "PinsTestOutput": PinsTestOutput, "PinsTestBaseLoader": PinsTestBaseLoader,
             "PinsTestApplySampler": PinsTestApplySampler}
    try:  # ComfyUI's own node (comfy_extras), where this ComfyUI has it
        from comfy_extras.nodes_torch_compile import TorchCompileModel
    except Exception:  # noqa: BLE001
        TorchCompileModel = None
    if TorchCompileModel is not None:
        found["TorchCompileModel"] = TorchCompileModel
    return found


class _Server:
    """What PromptExecutor needs of ComfyUI's server when no client listens."""
    client_id = None
    last_node_id = None
    last_prompt_id = None

    def send_sync(self, *args, **kwargs):
        pass


def _write_weights(path, seed):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    shapes = {"proj_in.weight": (64, 32), "proj_in.bias": (64,), "norm.weight": (64,), "norm.bias": (64,),
              "conv.weight": (4, 4, 3, 3), "conv.bias": (4,), "proj_out.weight": (32, 64)}
    save_file({k: (torch.randn(s, generator=g) * 0.2).half() for k, s in shapes.items()}, str(path))
    return str(path)


def _write_lora(path, seed, rank=4):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    sd = {}
    for prefix, (out_dim, in_dim) in {"lora.proj_in": (64, 32), "lora.proj_out": (32, 64)}.items():
        sd[f"{prefix}.lora_up.weight"] = (torch.randn(out_dim, rank, generator=g) * 0.1).half()
        sd[f"{prefix}.lora_down.weight"] = (torch.randn(rank, in_dim, generator=g) * 0.1).half()
        sd[f"{prefix}.alpha"] = torch.tensor(float(rank))
    save_file(sd, str(path))
    return str(path)


def _graph(weights, seed, lora=None, strength=1.0, lowvram=False):
    graph = {"1": {"class_type": "PinsTestLoader", "inputs": {"path": weights}}}
    model = ["1", 0]
    if lora is not None:
        graph["2"] = {"class_type": "PinsTestLora", "inputs": {"model": model, "path": lora, "strength": strength}}
        model = ["2", 0]
    graph["3"] = {"class_type": "PinsTestSampler", "inputs": {"model": model, "seed": seed, "lowvram": lowvram}}
    graph["4"] = {"class_type": "PinsTestOutput", "inputs": {"samples": ["3", 0]}}
    return graph


def _run(comfyui, graphs, between=None):
    """Runs the graphs as prompts through one executor (so the loader's model is
    cached across prompts, as in ComfyUI); ``between(i)`` runs before prompt i."""
    RUN.clear()
    kwargs = {}
    if "cache_args" in inspect.signature(comfyui.execution.PromptExecutor).parameters:  # 0.33: main.py's defaults
        kwargs["cache_args"] = {"lru": 0, "ram": 0, "ram_inactive": 0}
    executor = comfyui.execution.PromptExecutor(_Server(), cache_type=False, **kwargs)
    for i, graph in enumerate(graphs):
        if between is not None:
            between(i)
        executor.execute(graph, str(uuid.uuid4()), {}, ["4"])
        errors = [m for m in executor.status_messages if m[0] == "execution_error"]
        assert executor.success and not errors, errors
    import torch_pins.comfy as integration

    model = integration.model_id(RUN["patcher"])
    comfyui.mm.unload_all_models()
    import torch_pins as pins

    return types.SimpleNamespace(outputs=list(RUN["outputs"]), steps=list(RUN.get("steps", ())),
                                 inference_weights=RUN.get("inference_weights"), model=model,
                                 loaded=list(RUN.get("loaded", ())), unloaded=pins.stats())


def _delta(steps, key):
    """Per step, how much the counter ``key`` of pins.stats() grew."""
    return [after.get(key, 0) - before.get(key, 0) for before, after in steps]


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_weights_loaded_in_inference_mode_hit_from_the_second_step(comfyui, integration, tmp_path):
    weights = _write_weights(tmp_path / "model.safetensors", 1)
    graphs = [_graph(weights, seed) for seed in range(PROMPTS)]
    plain = _run(comfyui, graphs)
    assert plain.model == -1
    assert integration.enable(cpu_targets=True)
    served = _run(comfyui, graphs)
    assert served.inference_weights, "the loader ran inside the executor's inference_mode"
    assert _equal(served.outputs, plain.outputs), "pins changed the outputs"
    s = integration.stats()
    assert s.get("errors", 0) == 0 and s["casts"] == PROMPTS * STEPS * 4, s
    assert s["gathered"] == PROMPTS * STEPS * 3  # proj_in, norm, conv: weight and bias in one pin
    hits = _delta(served.steps, f"model.{served.model}.hits")
    misses = _delta(served.steps, f"model.{served.model}.misses")
    assert misses[0] == 4 and hits[0] == 0, (hits, misses)   # the first step pins each module once
    assert hits[1:] == [4] * (PROMPTS * STEPS - 1), hits      # every later step, every prompt: hits
    assert misses[1:] == [0] * (PROMPTS * STEPS - 1), misses
    # Note [Spared layers on the device]: after each load ComfyUI's own count of
    # what stays on the load device reached pins, and after /free's unload, none.
    key = f"model.{served.model}.device_bytes"
    assert len(served.loaded) == PROMPTS
    for on_device, total, stats in served.loaded:
        assert 0 < on_device <= total and stats[key] == on_device, (on_device, total, stats[key])
    assert served.unloaded[key] == 0


def test_a_weight_rewritten_with_copy_to_param_is_never_served_stale(comfyui, integration, tmp_path):
    weights = _write_weights(tmp_path / "model.safetensors", 2)
    graphs = [_graph(weights, seed) for seed in range(PROMPTS)]

    def rewrite(i):
        if i == 0:
            return
        with torch.inference_mode():  # as ComfyUI writes: .data of an inference tensor, no version counter
            new = torch.full((64, 32), 0.01 * i, dtype=torch.float16)
            comfyui.utils.copy_to_param(RUN["patcher"].model, "proj_in.weight", new)

    unwritten = _run(comfyui, graphs)
    plain = _run(comfyui, graphs, between=rewrite)
    assert _equal(plain.outputs[:1], unwritten.outputs[:1])
    assert not any(torch.equal(a, b) for a, b in zip(plain.outputs[1:], unwritten.outputs[1:])), \
        "the rewrite changes the outputs"
    assert integration.enable(cpu_targets=True)
    served = _run(comfyui, graphs, between=rewrite)
    assert _equal(served.outputs, plain.outputs), "a pin served the bytes from before copy_to_param"
    s = integration.stats()
    pinned_proj_in = (64 * 32 + 64) * 2  # weight and bias in one gathered pin, fp16
    assert s["invalidations"] == PROMPTS - 1 and s["invalidated_bytes"] == (PROMPTS - 1) * pinned_proj_in, s
    misses = _delta(served.steps, f"model.{served.model}.misses")
    assert misses[STEPS] == 1 and misses[2 * STEPS] == 1, misses  # only the rewritten module is pinned again


def test_lowvram_lora_patches_follow_their_signature(comfyui, integration, tmp_path):
    weights = _write_weights(tmp_path / "model.safetensors", 3)
    lora_a = _write_lora(tmp_path / "a.safetensors", 10)
    lora_b = _write_lora(tmp_path / "b.safetensors", 11)
    graphs = [_graph(weights, 5, lora_a, 1.0, lowvram=True),
              _graph(weights, 5, lora_b, 1.0, lowvram=True),   # a LoRA swap
              _graph(weights, 5, lora_a, 0.5, lowvram=True),   # same factors, another patch set
              _graph(weights, 5, lora_a, 1.0, lowvram=True),
              _graph(weights, 6, lora_a, 1.0, lowvram=True)]   # a seed change: ComfyUI keeps the patched model
    plain = _run(comfyui, graphs).outputs
    assert not _equal(plain[:1], plain[1:2]) and not _equal(plain[:1], plain[2:3])
    assert _equal(plain[:1], plain[3:4])
    assert integration.enable(cpu_targets=True)
    served = _run(comfyui, graphs)
    assert _equal(served.outputs, plain), "pins changed a patched output"
    s = integration.stats()
    assert s.get("errors", 0) == 0 and s["patch_casts"] == len(graphs) * STEPS * 4, s
    # The factors are kept in patches-loaded while their patch set is unchanged:
    # a new patch set (the LoRA node ran again) pins them at its prompt's first
    # step; the seed change reuses the patched model, so its first step hits too.
    patch_hits = _delta(served.steps, "patches-loaded.hits")
    patch_misses = _delta(served.steps, "patches-loaded.misses")
    assert sum(_delta(served.steps, "patches.misses")) == 0, "no factor is pinned for one node only"
    for p in range(len(graphs)):
        first = 0 if p == len(graphs) - 1 else 4
        assert patch_misses[p * STEPS] == first and patch_hits[p * STEPS] == 4 - first, (patch_misses, patch_hits)
        assert patch_hits[p * STEPS + 1:(p + 1) * STEPS] == [4] * (STEPS - 1), patch_hits
    # The streamed weights are the unpatched ones ComfyUI restores from its backup
    # every prompt: pinned once, served from then on, across the LoRA swaps.
    weight_misses = _delta(served.steps, "weights.misses")
    assert weight_misses == [4] + [0] * (len(graphs) * STEPS - 1), weight_misses
    # The LoRA files were read through pins.load_file: each factor's pin is filled
    # from its file; the old loader copied the weights into the model's own.
    assert _delta(served.steps, "file_fills") == patch_misses


def test_disabled_is_plain_comfyui_bit_for_bit(comfyui, integration, tmp_path):
    weights = _write_weights(tmp_path / "model.safetensors", 4)
    lora = _write_lora(tmp_path / "a.safetensors", 12)
    graphs = [_graph(weights, 1), _graph(weights, 2, lora, 0.8, lowvram=True)]
    originals = (comfyui.ops.cast_bias_weight, comfyui.mm.cast_to_device, comfyui.mm.load_models_gpu,
                 comfyui.utils.copy_to_param, comfyui.utils.load_torch_file, comfyui.execution.execute)
    plain = _run(comfyui, graphs).outputs
    with integration.enabled(cpu_targets=True):
        served = _run(comfyui, graphs).outputs
    after = _run(comfyui, graphs).outputs
    assert _equal(served, plain) and _equal(after, plain)
    assert (comfyui.ops.cast_bias_weight, comfyui.mm.cast_to_device, comfyui.mm.load_models_gpu,
            comfyui.utils.copy_to_param, comfyui.utils.load_torch_file, comfyui.execution.execute) == originals


def test_switched_off_by_the_environment(comfyui, integration, monkeypatch, tmp_path):
    monkeypatch.setenv(integration.ENV_VAR, "0")
    original = comfyui.ops.cast_bias_weight
    hooks = integration.enable(cpu_targets=True)
    assert not hooks and len(hooks) == 0
    assert comfyui.ops.cast_bias_weight is original


def _compile_graph(weights, seed, run):
    return {"1": {"class_type": "PinsTestBaseLoader", "inputs": {"path": weights}},
            "2": {"class_type": "TorchCompileModel", "inputs": {"model": ["1", 0], "backend": "inductor"}},
            "3": {"class_type": "PinsTestApplySampler",
                  "inputs": {"model": ["2", 0], "seed": seed, "lowvram": False, "run": run}},
            "4": {"class_type": "PinsTestOutput", "inputs": {"samples": ["3", 0]}}}


def _compiled_run(comfyui, graphs):
    """The prompts' outputs and how many frames Dynamo compiled for them
    (recompiles included), from a fresh Dynamo."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    run = _run(comfyui, graphs)
    return run, counters["frames"]["total"], counters["stats"]["unique_graphs"]


def test_comfyuis_torch_compile_model_node_compiles_as_often_with_pins_as_without(comfyui, integration, tmp_path,
                                                                                 fresh_compile):
    if "TorchCompileModel" not in comfyui.nodes.NODE_CLASS_MAPPINGS:
        pytest.skip("this ComfyUI has no TorchCompileModel node (comfy_extras.nodes_torch_compile)")
    weights = _write_weights(tmp_path / "model.safetensors", 9)
    # Two prompts with the same seed, then another seed: compiled once, reused.
    graphs = [_compile_graph(weights, seed, run) for run, seed in enumerate((1, 1, 2))]
    plain, plain_frames, plain_graphs = _compiled_run(comfyui, graphs)
    assert len(plain.outputs) == len(graphs) and _equal(plain.outputs[:1], plain.outputs[1:2])
    assert integration.enable(cpu_targets=True)
    served, frames, graphs_made = _compiled_run(comfyui, graphs)
    RUN["compile_counts"] = (plain_frames, plain_graphs, frames, graphs_made)
    print(f"TorchCompileModel (inductor), {len(graphs)} prompts of {STEPS} steps: Dynamo compiled "
          f"{plain_frames} frames ({plain_graphs} graphs) without pins, {frames} frames ({graphs_made} graphs) "
          f"with pins")
    assert (frames, graphs_made) == (plain_frames, plain_graphs), "pins made Dynamo compile more often"
    assert _equal(served.outputs, plain.outputs), "pins changed a compiled output"
    assert _equal(served.outputs[:1], served.outputs[1:2]), "two identical prompts differ"
    s = integration.stats()
    assert s.get("errors", 0) == 0, s
    hits = _delta(served.steps, f"model.{served.model}.hits")
    assert sum(hits[1:]) > 0 and _delta(served.steps, f"model.{served.model}.misses")[1:] == \
        [0] * (len(served.steps) - 1), "the compiled model casts through pins, from its pins after the first step"


def _tiny_wan_state_dict(kind):
    """A one-block WAN 2.1 (ComfyUI's own WanModel, dim 128) as a quantized
    checkpoint of ``kind``: its block's linear weights in fp8 or int8 with a
    scale each, declared as ComfyUI reads them (mixed_fp8 and int8: the
    ``_quantization_metadata`` header entry; scaled_fp8: the older
    ``scaled_fp8`` marker and ``.scale_weight`` keys)."""
    import json

    import comfy.ops
    from comfy.ldm.wan.model import WanModel

    torch.manual_seed(0)
    net = WanModel(dim=128, ffn_dim=256, num_layers=1, num_heads=1, in_dim=16, out_dim=16,
                   operations=comfy.ops.disable_weight_init)
    sd, layers = {}, {}
    for k, v in net.state_dict().items():
        v = (torch.randn(v.shape) * 0.02).half() if v.is_floating_point() else v
        if not (k.startswith("blocks.") and k.endswith(".weight") and v.dim() == 2):
            sd[k] = v
            continue
        layer = k[:-len(".weight")]
        if kind == "int8":
            scale = v.float().abs().amax() / 127
            sd[k] = torch.round(v.float() / scale).to(torch.int8)
        else:
            scale = v.float().abs().amax() / 448
            sd[k] = (v.float() / scale).to(torch.float8_e4m3fn)
        sd[layer + (".scale_weight" if kind == "scaled_fp8" else ".weight_scale")] = scale.reshape(())
        layers[layer] = {"format": "int8_tensorwise" if kind == "int8" else "float8_e4m3fn"}
    if kind == "scaled_fp8":
        sd["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
        return sd, {}
    return sd, {"_quantization_metadata": json.dumps({"layers": layers})}


@pytest.mark.parametrize("kind", ["mixed_fp8", "scaled_fp8", "int8"])
def test_pins_changes_nothing_comfyui_computes_about_a_quantized_model(comfyui, integration, kind, caplog):
    # ComfyUI 0.33's load_diffusion_model_state_dict makes the patcher before it
    # loads the weights: pins once asked it for model_size() there, which it
    # kept (the empty model's size), and its quantized ops logged a warning each.
    import comfy.sd

    if not hasattr(comfy.sd, "load_diffusion_model_state_dict") or importlib.util.find_spec("comfy.quant_ops") is None:
        pytest.skip("this ComfyUI has no quantized diffusion models (comfy.quant_ops)")

    def load():
        sd, metadata = _tiny_wan_state_dict(kind)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            patcher = comfy.sd.load_diffusion_model_state_dict(sd, metadata=metadata)
        warnings = [r.getMessage() for r in caplog.records if "uninitialized op" in r.getMessage()]
        size = patcher.model_size()
        return size, comfyui.mm.LoadedModel(patcher).model_memory(), warnings, patcher

    plain_size, plain_memory, plain_warnings, _ = load()
    assert plain_size > 1_000_000 and plain_memory == plain_size and plain_warnings == []
    assert integration.enable()
    size, memory, warnings, patcher = load()
    assert integration.model_id(patcher) >= 0
    assert (size, memory) == (plain_size, plain_memory), "pins changed ComfyUI's size of its model"
    assert warnings == [], "pins made ComfyUI log about its ops"


# --- ComfyUI-GGUF (issue 35): its layers cast their own weights ---

def _gguf_node_path():
    """A ComfyUI-GGUF checkout: $COMFYUI_GGUF_PATH, else one in the ComfyUI
    checkout's custom_nodes/ (scripts/comfyui_checkout.sh puts it there)."""
    path = os.environ.get("COMFYUI_GGUF_PATH")
    if path:
        return path
    root = os.path.join(COMFYUI_PATH, "custom_nodes")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        ops = os.path.join(root, name, "ops.py")
        if os.path.isfile(ops) and "class GGMLLayer" in open(ops).read():
            return os.path.join(root, name)
    return None


GGUF_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def _write_tiny_wan_gguf(path):
    """A one-block WAN 2.1 (ComfyUI's WanModel, dim 128) as a GGUF file, as
    ComfyUI-GGUF's converter writes one: its 2-D weights quantized in turn as
    Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1, 1-D biases F16, other tensors F32, the
    5-D patch embedding flattened with its shape in ``comfy.gguf.orig_shape``.
    Returns the quantized tensors' names by type."""
    import comfy.ops
    import gguf
    import numpy as np
    from comfy.ldm.wan.model import WanModel

    torch.manual_seed(0)
    net = WanModel(dim=128, ffn_dim=256, num_layers=1, num_heads=1, in_dim=16, out_dim=16,
                   operations=comfy.ops.disable_weight_init)
    writer = gguf.GGUFWriter(str(path), "wan")
    by_type = {t: [] for t in GGUF_TYPES}
    g = torch.Generator().manual_seed(5)
    for k, v in net.state_dict().items():
        a = (torch.randn(v.shape, generator=g) * 0.05).numpy().astype(np.float32)
        if v.dim() == 2 and v.shape[1] % 32 == 0:
            qtype = GGUF_TYPES[sum(len(n) for n in by_type.values()) % len(GGUF_TYPES)]
            by_type[qtype].append(k)
            writer.add_tensor(k, gguf.quants.quantize(a, gguf.GGMLQuantizationType[qtype]),
                              raw_dtype=gguf.GGMLQuantizationType[qtype])
        elif v.dim() > 4:
            writer.add_array(f"comfy.gguf.orig_shape.{k}", list(v.shape))
            writer.add_tensor(k, a.reshape(v.shape[0], -1).astype(np.float16))
        elif v.dim() == 1 and k.endswith(".bias"):
            writer.add_tensor(k, a.astype(np.float16))
        else:
            writer.add_tensor(k, a)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return by_type


def _run_gguf(comfyui, name, steps=3):
    """ComfyUI-GGUF's UnetLoaderGGUF loads the file, ComfyUI loads the model,
    then ``steps`` calls of its apply_model; the outputs and pins.stats() per step."""
    import torch_pins as pins
    import torch_pins.comfy as integration

    (patcher,) = comfyui.nodes.NODE_CLASS_MAPPINGS["UnetLoaderGGUF"]().load_unet(name)
    comfyui.mm.load_models_gpu([patcher])
    g = torch.Generator().manual_seed(1)
    x, context = torch.randn(1, 16, 1, 4, 4, generator=g), torch.randn(1, 8, 4096, generator=g)
    outputs, stats = [], []
    for _ in range(steps):
        before = pins.stats()
        with torch.inference_mode():
            outputs.append(patcher.model.apply_model(x, torch.tensor([0.5]), c_crossattn=context))
        stats.append((before, pins.stats()))
    model = integration.model_id(patcher)
    comfyui.mm.unload_all_models()
    return types.SimpleNamespace(outputs=outputs, steps=stats, model=model, patcher=patcher)


def _unload_node(comfyui, node, node_classes):
    """Forgets the custom node at ``node``: its modules (ComfyUI names them
    after its path) and the node classes its load added."""
    name = node.replace(".", "_x_")
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    for name in set(comfyui.nodes.NODE_CLASS_MAPPINGS) - node_classes:
        comfyui.nodes.NODE_CLASS_MAPPINGS.pop(name)
        comfyui.nodes.NODE_DISPLAY_NAME_MAPPINGS.pop(name, None)


def test_comfyui_gguf_layers_cast_through_pins_bit_identical_and_hit_from_the_second_step(comfyui, integration,
                                                                                         tmp_path, request):
    pytest.importorskip("gguf", reason="ComfyUI-GGUF needs the gguf package")
    node = _gguf_node_path()
    if node is None:
        pytest.skip("no ComfyUI-GGUF checkout: set COMFYUI_GGUF_PATH or put one in the checkout's custom_nodes/")
    import asyncio

    import folder_paths

    by_type = _write_tiny_wan_gguf(tmp_path / "tiny.gguf")
    assert all(by_type.values()), by_type
    folder_paths.add_model_folder_path("unet", str(tmp_path))
    loaded = "UnetLoaderGGUF" in comfyui.nodes.NODE_CLASS_MAPPINGS
    if not loaded:
        # Unloaded again afterwards: a later test (test_comfy_standins.py's
        # stand-in of the node, in the same process) finds no ComfyUI-GGUF.
        request.addfinalizer(functools.partial(_unload_node, comfyui, node, set(comfyui.nodes.NODE_CLASS_MAPPINGS)))
        # Loaded as ComfyUI loads it, with pins enabled: its hooks go in as it arrives.
        assert integration.enable(cpu_targets=True)
        assert not {"ComfyUI-GGUF.ops.GGMLLayer.cast_bias_weight"} & set(integration.stats()["hooks"])
        assert asyncio.run(comfyui.nodes.load_custom_node(node))
        assert {"ComfyUI-GGUF.ops.GGMLLayer.cast_bias_weight", "ComfyUI-GGUF.ops.GGMLTensor.to"} <= \
            set(integration.stats()["hooks"])
        integration.disable()
    plain = _run_gguf(comfyui, "tiny.gguf")
    assert plain.model == -1
    hooks = integration.enable(cpu_targets=True)  # ComfyUI-GGUF is loaded already: found where it is
    assert {"ComfyUI-GGUF.ops.GGMLLayer.cast_bias_weight", "ComfyUI-GGUF.ops.GGMLTensor.to"} <= hooks
    served = _run_gguf(comfyui, "tiny.gguf")
    assert all(torch.equal(a, b) for a, b in zip(served.outputs, plain.outputs)), "pins changed a GGUF output"
    s = integration.stats()
    quantized = sum(len(v) for v in by_type.values())
    hits = _delta(served.steps, f"model.{served.model}.hits")
    misses = _delta(served.steps, f"model.{served.model}.misses")
    print(f"GGUF (tiny WAN, {quantized} quantized weights of {', '.join(GGUF_TYPES)}), 3 steps with pins: "
          f"hits {hits}, misses {misses}, {s.get('gguf_casts')} GGUF casts")
    assert s.get("errors", 0) == 0 and s["gguf_casts"] >= 3 * quantized, s
    assert misses[0] >= quantized and misses[1:] == [0, 0], misses
    assert hits[0] == 0 and hits[1] == hits[2] == misses[0], hits
    integration.disable()
    after = _run_gguf(comfyui, "tiny.gguf")
    assert all(torch.equal(a, b) for a, b in zip(after.outputs, plain.outputs))


# Hook points only ComfyUI with dynamic VRAM (0.33) has.
NEWER_HOOKS = {"comfy.model_management.cast_to_gathered", "comfy.model_management.reset_cast_buffers",
               "comfy.model_patcher.PromptModelTracker.start", "comfy.model_patcher.PromptModelTracker.add",
               "comfy.model_patcher.PromptModelTracker.end", "comfy.model_patcher.ModelPatcher.pin_weight_to_device",
               "comfy.model_management.free_pins", "comfy.model_management.ensure_pin_registerable"}


def _has_dynamic_vram():
    return importlib.util.find_spec("comfy.pinned_memory") is not None


def test_every_hook_point_of_this_comfyui_is_found(comfyui, integration):
    hooks = integration.enable()
    assert hooks.active and hooks.failed == {} and hooks.awaited == ()
    if _has_dynamic_vram():
        assert hooks.missing == (), hooks.missing
        assert {"comfy.pinned_memory.get_pin", "comfy.pinned_memory.pin_memory"} | NEWER_HOOKS <= hooks
    else:  # 0.3.64: the hooks of later ComfyUI are looked up and left out
        assert set(hooks.missing) <= NEWER_HOOKS, hooks.missing


class _FakeCudart:
    """torch.cuda.cudart() of a CUDA machine, for ComfyUI's own pinning on this CPU one."""

    def cudaHostRegister(self, ptr, size, flags):
        return 0

    def cudaHostUnregister(self, ptr):
        return 0


def test_the_old_loader_does_not_page_lock_a_weight_pins_pins(comfyui, integration, monkeypatch, tmp_path):
    registered = []

    class Cudart(_FakeCudart):
        def cudaHostRegister(self, ptr, size, flags):
            registered.append(size)
            return 0

    # ComfyUI pins as on an NVIDIA machine (0.3.64 has no such cap, and pins nothing)
    monkeypatch.setattr(comfyui.mm, "MAX_PINNED_MEMORY", 1 << 30, raising=False)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    weights = _write_weights(tmp_path / "model.safetensors", 8)
    graphs = [_graph(weights, seed, lowvram=True) for seed in range(2)]
    plain = _run(comfyui, graphs).outputs
    if not registered:
        pytest.skip("this ComfyUI does not page-lock offloaded weights (pin_weight_to_device)")
    registered.clear()
    assert integration.enable(cpu_targets=True)
    served = _run(comfyui, graphs)
    assert _equal(served.outputs, plain), "pins changed the outputs"
    s = integration.stats()
    assert registered == [] and s["declined_pins"] > 0, (registered, s)
    assert s.get("errors", 0) == 0 and s.get("casts") == len(graphs) * STEPS * 4, s


def _dynamic_net(c, path):
    """Three manual_cast layers (32 KiB each: aimdo's stand-in pages them) under
    dynamic VRAM, loaded as ComfyUI loads a model there."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(c.ops.manual_cast.Linear(128, 128, dtype=torch.float16)
                                              for _ in range(3))

    net = Net()
    net.load_state_dict(c.utils.load_torch_file(path), assign=True)
    return net


def _vbar_forward(c, net, x):
    """What a dynamic layer's cast_bias_weight does on a GPU, on this CPU: ComfyUI's
    own cast_modules_with_vbar and resolve_cast_module_with_vbar, then the unpin
    of uncast_bias_weight."""
    import comfy_aimdo.model_vbar

    for s in net.layers:
        c.ops.cast_modules_with_vbar([s], x.dtype, x.device, x.dtype, False)
        w, b = c.ops.resolve_cast_module_with_vbar(s, x.dtype, x.device, x.dtype, None, False)
        faulted = s._prefetch["signature"] is not None
        del s._prefetch
        if faulted:
            comfy_aimdo.model_vbar.vbar_unpin(s._v)
        x = torch.nn.functional.linear(x, w, b)
    return x


@pytest.mark.parametrize("vram_kib", [72, 16])  # two of three layers fit (weights-loaded); none does (weights)
def test_dynamic_vram_layers_are_pinned_once_by_pins(comfyui, integration, pins, monkeypatch, tmp_path, vram_kib):
    if not _has_dynamic_vram():
        pytest.skip("this ComfyUI predates dynamic VRAM (comfy.pinned_memory)")
    import comfy.memory_management
    import comfy_aimdo.control
    import comfy_aimdo.model_vbar

    assert comfy_aimdo.__file__.startswith(STANDINS), "the stand-in, never a real aimdo on the CPU"
    g = torch.Generator().manual_seed(7)
    path = str(tmp_path / "dyn.safetensors")
    comfyui.utils.save_torch_file({f"layers.{i}.{k}": (torch.randn(*shape, generator=g) / 8).half()
                                   for i in range(3) for k, shape in (("weight", (128, 128)), ("bias", (128,)))},
                                  path)
    comfy_aimdo.control.init()
    comfy_aimdo.control.init_devices([0])
    comfy_aimdo.model_vbar.configure(vram_bytes=vram_kib * 1024, page_size=4096)
    monkeypatch.setattr(comfy.memory_management, "aimdo_enabled", True)
    monkeypatch.setattr(comfyui.mm, "MAX_PINNED_MEMORY", 1 << 30)  # ComfyUI pins as on an NVIDIA machine
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart())
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")  # a "GPU" the stand-in's vbar backs with CPU memory
    x = torch.randn(4, 128, generator=g)
    passes = 3

    def run():
        net = _dynamic_net(comfyui, path)
        patcher = comfyui.mp.ModelPatcherDynamic(net, load_device=gpu, offload_device=cpu)
        patcher.partially_load(gpu)
        steps = []
        for _ in range(passes):
            before = pins.stats()
            with torch.no_grad():
                out = _vbar_forward(comfyui, net, x)
            steps.append((out, before, pins.stats()))
        comfy_pinned = comfyui.mm.TOTAL_PINNED_MEMORY
        patcher.partially_unload_ram(1e30)
        return steps, comfy_pinned, patcher

    total_before = comfyui.mm.TOTAL_PINNED_MEMORY
    plain, comfy_pinned, _ = run()
    assert comfy_pinned - total_before == 3 * 33792, "without pins ComfyUI pins each layer itself"
    hooks = integration.enable(cpu_targets=True)
    assert hooks.active and hooks.mode == "dynamic-vram", hooks
    served, comfy_pinned, patcher = run()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, served)), "pins changed an output"
    assert comfy_pinned == comfyui.mm.TOTAL_PINNED_MEMORY, "ComfyUI pinned nothing of its own: one pinned copy"
    s = integration.stats()
    assert s.get("errors", 0) == 0 and s["vbar_casts"] > 0 and s["declined_pins"] > 0, s
    model = integration.model_id(patcher)
    subset = "weights-loaded" if vram_kib == 72 else "weights"
    misses = [after.get(f"model.{model}.{subset}.misses", 0) - before.get(f"model.{model}.{subset}.misses", 0)
              for _, before, after in served]
    hits = [after.get(f"model.{model}.{subset}.hits", 0) - before.get(f"model.{model}.{subset}.hits", 0)
            for _, before, after in served]
    assert misses[0] == 3 and sum(misses[1:]) == 0, misses  # weight and bias of each layer: one pin, once
    # load_torch_file read the file through pins.load_file: each pin is filled from the file
    fills = [after["file_fills"] - before["file_fills"] for _, before, after in served]
    assert fills == [2 * m for m in misses], fills  # weight and bias, each from its place in the file
    assert hits[0] == 0 and all(h > 0 for h in hits[1:]), hits  # every layer cast again comes from its pin


def test_models_are_registered_by_class_and_forgotten_with_their_weights(comfyui, integration, pins):
    assert integration.enable()
    net = _tiny_net(comfyui.ops)()
    patcher = comfyui.mp.ModelPatcher(net, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
    clone = patcher.clone()
    model = integration.model_id(patcher)
    assert model >= 0 and integration.model_id(clone) == model
    assert f"model.{model}.hits" in pins.stats() and "model.TinyNet.hits" in pins.stats()
    # Note [Prewarm]: registered with ComfyUI's own size of its weights.
    assert pins.stats()[f"model.{model}.size"] == patcher.model_size() > 0
    models = pins.stats()["models"]
    del net, patcher, clone
    gc.collect()
    assert pins.stats()["models"] == models - 1


def test_comfyuis_quantized_tensor_is_cast_as_itself(comfyui, integration, pins):
    quant = pytest.importorskip("comfy.quant_ops", reason="this ComfyUI has no comfy.quant_ops (QuantizedTensor)")
    QuantizedTensor = getattr(quant, "QuantizedTensor", None)
    layout = getattr(quant, "TensorCoreFP8Layout", None)
    if QuantizedTensor is None or layout is None or not hasattr(QuantizedTensor, "__tensor_flatten__"):
        pytest.skip("this ComfyUI's QuantizedTensor has no flatten protocol or no FP8 layout")
    with torch.inference_mode():
        weight = torch.randn(64, 32)
        q = QuantizedTensor.from_float(weight, "TensorCoreFP8Layout", scale=torch.tensor(0.01))
    model = pins.register_model("quantized", "cpu")
    try:
        before = pins.stats()
        out = [pins.cast_to_device(q, "cpu", model=model) for _ in range(3)]
        after = pins.stats()
    finally:
        pins.forget_model(model)
    assert all(type(o) is QuantizedTensor for o in out)
    assert all(torch.equal(o.dequantize(), q.dequantize()) for o in out)
    assert after["misses"] - before["misses"] == 1 and after["hits"] - before["hits"] == 2


# --- load_torch_file reads safetensors through pins.load_file (issue 25) ---

def _write_checkpoint(path, metadata=None, **extra):
    """The dtypes ComfyUI's models come in, an empty tensor among them; names
    not in sorted order in the file."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    sd = {"z.weight": torch.randn(16, 8, generator=g).half(), "a.bias": torch.randn(16, generator=g).bfloat16(),
          "m.scale": torch.randn(4, generator=g), "m.index": torch.arange(6), "m.mask": torch.tensor([True, False]),
          "m.fp8": torch.randn(8, generator=g).to(torch.float8_e4m3fn), "m.empty": torch.zeros(0, 4),
          "b.bytes": torch.arange(7, dtype=torch.uint8), **extra}
    save_file(sd, str(path), metadata=metadata)
    return str(path)


def _assert_same_state_dict(ours, theirs):
    assert list(ours) == list(theirs), "the same keys, in ComfyUI's order"
    for k in theirs:
        a, b = ours[k], theirs[k]
        assert (a.dtype, a.shape, a.device, a.is_inference()) == (b.dtype, b.shape, b.device, b.is_inference()), k
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), k


def test_safetensors_files_load_through_pins_as_comfyuis_own_loader(comfyui, integration, pins, tmp_path):
    import comfy.clip_vision

    own = comfyui.utils.load_torch_file
    with_metadata = _write_checkpoint(tmp_path / "model.safetensors", {"format": "pt", "modelspec.title": "t"})
    without = _write_checkpoint(tmp_path / "lora.sft")
    hooks = integration.enable()
    assert {"comfy.utils.load_torch_file", "comfy.clip_vision.load_torch_file"} <= hooks
    assert comfy.clip_vision.load_torch_file is not own, "CLIP vision loads through pins too"
    mapped = pins.stats()["mapped_files"]
    sd, metadata = comfyui.utils.load_torch_file(with_metadata, safe_load=True, return_metadata=True)
    assert pins.stats()["mapped_files"] == mapped + 1, "the tensors lie in pins' mapping of the file"
    theirs, their_metadata = own(with_metadata, safe_load=True, return_metadata=True)
    _assert_same_state_dict(sd, theirs)
    assert metadata == their_metadata == {"format": "pt", "modelspec.title": "t"}
    sd, metadata = comfyui.utils.load_torch_file(without, return_metadata=True)
    theirs, their_metadata = own(without, return_metadata=True)
    _assert_same_state_dict(sd, theirs)
    assert metadata is None and their_metadata is None
    with torch.inference_mode():  # as ComfyUI's executor runs loaders
        _assert_same_state_dict(comfy.clip_vision.load_torch_file(without), own(without))
    s = integration.stats()
    assert s["loaded_files"] == 3 and not any(k.startswith("load_fallback.") for k in s), s


def test_files_pins_does_not_read_are_comfyuis_own(comfyui, integration, monkeypatch, tmp_path):
    own = comfyui.utils.load_torch_file
    ckpt = str(tmp_path / "model.ckpt")
    torch.save({"state_dict": {"w": torch.arange(4.0)}}, ckpt)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    nvfp4 = _write_checkpoint(tmp_path / "nvfp4.safetensors",
                              q=torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
    with pytest.raises(Exception) as theirs:
        own(str(bad))
    assert integration.enable()
    assert torch.equal(comfyui.utils.load_torch_file(ckpt, safe_load=True)["w"], torch.arange(4.0))
    _assert_same_state_dict(comfyui.utils.load_torch_file(nvfp4), own(nvfp4))  # F4: pins has no dtype for it
    with pytest.raises(type(theirs.value)) as ours:
        comfyui.utils.load_torch_file(str(bad))
    assert str(ours.value) == str(theirs.value), "ComfyUI's own error"
    monkeypatch.setattr(comfyui.utils, "DISABLE_MMAP", True)
    _assert_same_state_dict(comfyui.utils.load_torch_file(nvfp4), own(nvfp4))
    s = integration.stats()
    assert {k: v for k, v in s.items() if k.startswith("load_fallback.")} == {
        "load_fallback.not-safetensors": 1, "load_fallback.refused": 2, "load_fallback.disable-mmap": 1}, s
    assert s.get("loaded_files", 0) == 0


def test_under_dynamic_vram_the_dict_is_load_safetensors_own(comfyui, integration, monkeypatch, tmp_path):
    if not hasattr(comfyui.utils, "load_safetensors"):
        pytest.skip("this ComfyUI predates dynamic VRAM (comfy.utils.load_safetensors)")
    import comfy.memory_management

    own = comfyui.utils.load_torch_file
    path = _write_checkpoint(tmp_path / "model.safetensors")
    e8m0 = _write_checkpoint(tmp_path / "e8m0.safetensors", s=torch.ones(4).to(torch.float8_e8m0fnu))
    assert integration.enable()
    monkeypatch.setattr(comfy.memory_management, "aimdo_enabled", True)  # read at each load, as ComfyUI does
    monkeypatch.setattr(comfyui.utils, "DISABLE_MMAP", True)  # which ComfyUI's dynamic path does not read
    sd, metadata = comfyui.utils.load_torch_file(path, return_metadata=True)
    theirs, their_metadata = own(path, return_metadata=True)
    assert list(theirs) != sorted(theirs), "the header's order, not safe_open's"
    _assert_same_state_dict(sd, theirs)
    assert metadata == their_metadata == {}
    with pytest.raises(KeyError) as theirs:
        own(e8m0)
    with pytest.raises(KeyError) as ours:  # a dtype load_safetensors has no torch type for
        comfyui.utils.load_torch_file(e8m0)
    assert str(ours.value) == str(theirs.value)
    s = integration.stats()
    assert s["loaded_files"] == 1 and s["load_fallback.dtype"] == 1, s
