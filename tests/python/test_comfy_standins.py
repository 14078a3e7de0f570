"""torch_pins.comfy against small stand-ins for ComfyUI's modules: the hook logic
(what is routed, what falls back and why, the boundaries, invalidation, RAM
pressure, disable) without a ComfyUI checkout. test_comfy.py runs the same
integration against a real ComfyUI when COMFYUI_PATH is set.

The stand-ins have ComfyUI's function names and call shapes, and behaviour just
large enough to check results against: they are not ComfyUI's code."""
import asyncio
import contextlib
import gc
import importlib
import importlib.util
import logging
import os
import pkgutil
import sys
import types

import pytest
import torch


def _stand_in_comfy(with_executor=True, with_ram_points=True):
    """Fresh stand-in modules: comfy, comfy.ops, comfy.model_management,
    comfy.utils, comfy.model_patcher and (optionally) execution."""
    comfy = types.ModuleType("comfy")
    comfy.__path__ = []
    mm = types.ModuleType("comfy.model_management")
    ops = types.ModuleType("comfy.ops")
    utils = types.ModuleType("comfy.utils")
    mp = types.ModuleType("comfy.model_patcher")
    mm.calls = []
    mm.unloads = []  # what free_memory reports it unloaded

    def cast_to(weight, dtype=None, device=None, non_blocking=False, copy=False):
        if device is None or weight.device == device:
            if not copy and (dtype is None or weight.dtype == dtype):
                return weight
            return weight.to(dtype=dtype, copy=copy)
        r = torch.empty_like(weight, dtype=dtype, device=device)
        r.copy_(weight, non_blocking=non_blocking)
        return r

    def cast_to_device(tensor, device, dtype, copy=False):
        return cast_to(tensor, dtype=dtype, device=device, copy=copy)

    def load_models_gpu(models, memory_required=0, force_patch_weights=False):
        mm.calls.append(("load_models_gpu", list(models)))

    def free_memory(memory_required, device, keep_loaded=[]):
        mm.calls.append(("free_memory", memory_required, device))
        return list(mm.unloads)

    mm.cast_to, mm.cast_to_device = cast_to, cast_to_device
    mm.load_models_gpu = load_models_gpu
    mm.device_supports_non_blocking = lambda device: False
    mm.free_ram_reported = 64 << 30
    mm.get_free_memory = lambda dev=None, torch_free_too=False: mm.free_ram_reported
    if with_ram_points:
        mm.free_memory = free_memory

    def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None):
        if input is not None:
            dtype = input.dtype if dtype is None else dtype
            bias_dtype = dtype if bias_dtype is None else bias_dtype
            device = input.device if device is None else device
        bias = None
        if s.bias is not None:
            bias = mm.cast_to(s.bias, bias_dtype, device, copy=len(s.bias_function) > 0)
            for f in s.bias_function:
                bias = f(bias)
        weight = mm.cast_to(s.weight, dtype, device, copy=len(s.weight_function) > 0)
        for f in s.weight_function:
            weight = f(weight)
        return weight, bias

    class Linear(torch.nn.Linear):
        weight_function = []
        bias_function = []

        def forward(self, x):
            w, b = ops.cast_bias_weight(self, x)
            return torch.nn.functional.linear(x, w, b)

    ops.cast_bias_weight = cast_bias_weight
    ops.Linear = Linear

    def get_attr(obj, attr):
        for name in attr.split("."):
            obj = getattr(obj, name)
        return obj

    def set_attr(obj, attr, value):
        *path, last = attr.split(".")
        for name in path:
            obj = getattr(obj, name)
        prev = getattr(obj, last)
        setattr(obj, last, value)
        return prev

    def set_attr_param(obj, attr, value):
        return set_attr(obj, attr, torch.nn.Parameter(value, requires_grad=False))

    def copy_to_param(obj, attr, value):
        get_attr(obj, attr).data.copy_(value)

    utils.get_attr, utils.set_attr, utils.set_attr_param, utils.copy_to_param = \
        get_attr, set_attr, set_attr_param, copy_to_param

    utils.DISABLE_MMAP = False
    utils.loads = []  # the files the stand-in loader read itself

    def load_torch_file(ckpt, safe_load=False, device=None, return_metadata=False):
        """ComfyUI's loader as far as the tests look: safetensors through
        safe_open (sorted keys, its metadata), or load_safetensors when dynamic
        VRAM is on; other files through torch.load."""
        import safetensors

        utils.loads.append(ckpt)
        device = torch.device("cpu") if device is None else device
        metadata = None
        if ckpt.lower().endswith((".safetensors", ".sft")):
            if getattr(sys.modules.get("comfy.memory_management"), "aimdo_enabled", False):
                sd, metadata = utils.load_safetensors(ckpt)
            else:
                with safetensors.safe_open(ckpt, framework="pt", device="cpu") as f:
                    sd = {k: f.get_tensor(k).to(device) for k in f.keys()}
                    metadata = f.metadata()
        else:
            sd = torch.load(ckpt, map_location=device, weights_only=True)
        return (sd, metadata) if return_metadata else sd

    utils.load_torch_file = load_torch_file

    class LowVramPatch:
        """A patch function shaped like ComfyUI's: adds up @ down, whose factors
        it brings over with comfy.model_management.cast_to_device."""

        def __init__(self, key, patches):
            self.key, self.patches = key, patches

        def __call__(self, weight):
            for strength, (up, down), _, _, _ in self.patches[self.key]:
                up = mm.cast_to_device(up, weight.device, torch.float32)
                down = mm.cast_to_device(down, weight.device, torch.float32)
                weight += (strength * (up @ down)).to(weight.dtype)
            return weight

    class ModelPatcher:
        def __init__(self, model, load_device, offload_device):
            self.model, self.load_device, self.offload_device = model, load_device, offload_device
            self.patches = {}

        def clone(self):
            n = self.__class__(self.model, self.load_device, self.offload_device)
            n.patches = {k: v[:] for k, v in self.patches.items()}
            return n

        def model_patches_models(self):
            return []

        size = 0

        def model_size(self):  # ComfyUI's: module_size(self.model), cached on the patcher
            if self.size > 0:
                return self.size
            self.size = sum(t.nbytes for t in self.model.state_dict().values())
            return self.size

        def patch_weight_to_device(self, key, device_to=None, inplace_update=False):
            if key not in self.patches:
                return
            weight = utils.get_attr(self.model, key)
            out = weight.to(torch.float32, copy=True)
            for strength, (up, down), _, _, _ in self.patches[key]:
                out += strength * (up.float() @ down.float())
            weight.data.copy_(out.to(weight.dtype))  # like a set_func writing .data

    mp.ModelPatcher, mp.LowVramPatch = ModelPatcher, LowVramPatch
    comfy.ops, comfy.model_management, comfy.utils, comfy.model_patcher = ops, mm, utils, mp

    nodes = types.ModuleType("nodes")

    async def load_custom_node(module_path, ignore=set(), module_parent="custom_nodes"):
        """As ComfyUI's: a custom node's package imported under its path."""
        name = module_path.replace(".", "_x_")
        spec = importlib.util.spec_from_file_location(name, os.path.join(module_path, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return True

    nodes.load_custom_node = load_custom_node
    modules = {"comfy": comfy, "comfy.ops": ops, "comfy.model_management": mm,
               "comfy.utils": utils, "comfy.model_patcher": mp, "nodes": nodes}

    if with_executor:
        execution = types.ModuleType("execution")
        execution.log = []

        async def execute(server, prompt, node_id):
            execution.log.append(("node", node_id))
            return server.run_node(prompt, node_id)

        class PromptExecutor:
            def __init__(self, server):
                self.server = server

            def execute(self, prompt, prompt_id):
                asyncio.run(self.execute_async(prompt, prompt_id))

            async def execute_async(self, prompt, prompt_id):
                execution.log.append(("prompt", prompt_id))
                with torch.inference_mode():
                    for node_id in prompt:
                        await execution.execute(self.server, prompt, node_id)

        execution.execute, execution.PromptExecutor = execute, PromptExecutor
        modules["execution"] = execution
    return modules


class _Recorder:
    """Stands in for the torch_pins module inside torch_pins.comfy: records each
    call and runs the real op."""

    def __init__(self, real):
        self._real, self.calls = real, []

    def __getattr__(self, name):
        target = getattr(self._real, name)
        if not callable(target):
            return target

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return target(*args, **kwargs)
        return call

    def names(self):
        return [c[0] for c in self.calls]


def _record_pins_calls(monkeypatch, integration, recorder):
    """Every module of the torch_pins.comfy package calls pins through its own
    module-level name ``pins``: each one calls ``recorder`` instead (or the
    real module again, given it)."""
    for info in pkgutil.iter_modules(integration.__path__):
        module = importlib.import_module(f"{integration.__name__}.{info.name}")
        if hasattr(module, "pins"):
            monkeypatch.setattr(module, "pins", recorder)
    monkeypatch.setattr(integration, "pins", recorder)


class TinyNet(torch.nn.Module):
    def __init__(self, ops, dtype=torch.float16):
        super().__init__()
        self.l1 = ops.Linear(8, 16, dtype=dtype)
        self.l2 = ops.Linear(16, 4, bias=False, dtype=dtype)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


@pytest.fixture
def comfy_env(monkeypatch, pins):
    """Stand-in ComfyUI in sys.modules, torch_pins.comfy's pins calls recorded;
    the integration disabled again afterwards."""
    import torch_pins.comfy as integration

    modules = _stand_in_comfy()
    for name in [n for n in sys.modules if n.startswith("comfy.")]:
        monkeypatch.delitem(sys.modules, name)  # a real ComfyUI test_comfy.py imported: out of sight
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    recorder = _Recorder(pins)
    _record_pins_calls(monkeypatch, integration, recorder)
    monkeypatch.delenv(integration.ENV_VAR, raising=False)
    yield types.SimpleNamespace(m=modules, rec=recorder, integration=integration, pins=pins)
    integration.disable()


def _net_and_patcher(env, weights_in_inference_mode=True):
    ops, mp = env.m["comfy.ops"], env.m["comfy.model_patcher"]
    torch.manual_seed(0)
    net = TinyNet(ops)
    if weights_in_inference_mode:  # as ComfyUI's executor loads them
        with torch.inference_mode():
            state = {k: v.clone() for k, v in net.state_dict().items()}
            net = TinyNet(ops)
            net.load_state_dict(state)
    return net, mp.ModelPatcher(net, torch.device("cpu"), torch.device("cpu"))


def _plain_forward(net, x):
    w1, b1, w2 = (t.float() for t in (net.l1.weight, net.l1.bias, net.l2.weight))
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2)


def test_enable_then_disable_restores_every_original(comfy_env):
    m = comfy_env.m
    originals = {
        ("comfy.ops", "cast_bias_weight"): m["comfy.ops"].cast_bias_weight,
        ("comfy.model_management", "cast_to_device"): m["comfy.model_management"].cast_to_device,
        ("comfy.model_management", "load_models_gpu"): m["comfy.model_management"].load_models_gpu,
        ("comfy.model_management", "free_memory"): m["comfy.model_management"].free_memory,
        ("comfy.utils", "copy_to_param"): m["comfy.utils"].copy_to_param,
        ("comfy.utils", "load_torch_file"): m["comfy.utils"].load_torch_file,
        ("execution", "execute"): m["execution"].execute,
    }
    patcher_init = vars(m["comfy.model_patcher"].ModelPatcher)["__init__"]
    execute_async = vars(m["execution"].PromptExecutor)["execute_async"]
    first = comfy_env.integration.enable()
    assert first and first.active and first.mode == "old-loader"
    hooked = {name: getattr(m[module], name) for module, name in originals}
    again = comfy_env.integration.enable()  # again: nothing changes, the same report
    assert again == first and again.active
    for (module, name), original in originals.items():
        assert getattr(m[module], name) is not original, f"{module}.{name} not hooked"
        assert getattr(m[module], name) is hooked[name], f"{module}.{name} hooked twice"
    assert m["comfy.model_patcher"].ModelPatcher.__init__ is not patcher_init
    comfy_env.integration.disable()
    for (module, name), original in originals.items():
        assert getattr(m[module], name) is original, f"{module}.{name} not restored"
    assert vars(m["comfy.model_patcher"].ModelPatcher)["__init__"] is patcher_init
    assert vars(m["execution"].PromptExecutor)["execute_async"] is execute_async
    assert comfy_env.integration.stats() == {"enabled": False, "why": "disable() was called"}


def test_the_hook_table_is_the_one_docs_usage_shows(comfy_env):
    """Every hook point comes from one table (Note [ComfyUI hook points]), which
    docs/USAGE.md "ComfyUI" shows row for row."""
    table = comfy_env.integration.hooks.TABLE
    rows = [f"| `{p.name}` | {p.releases} | {p.does} |" for p in table]
    usage = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "USAGE.md")).read()
    header = "| ComfyUI function | ComfyUI releases | what pins does there |\n| --- | --- | --- |\n"
    assert header in usage
    shown = usage.split(header, 1)[1].split("\n\n", 1)[0].splitlines()
    assert shown == rows, "docs/USAGE.md's table differs from hooks.TABLE; its rows should be:\n" + "\n".join(rows)
    assert len({p.name for p in table}) == len(table), "one row per hook point"
    hooks = comfy_env.integration.enable(cpu_targets=True)
    assert set(hooks) <= {p.name for p in table}, "every hook installed is a row of the table"


def test_an_inherited_method_is_hooked_on_the_class_and_unhooked_by_deletion(comfy_env):
    mp = comfy_env.m["comfy.model_patcher"]
    base = mp.ModelPatcher
    # a ComfyUI whose ModelPatcher inherits the writer from a base class
    mp.ModelPatcher = type("ModelPatcher", (base,), {"__init__": base.__init__})
    comfy_env.integration.enable()
    assert "patch_weight_to_device" in vars(mp.ModelPatcher)
    comfy_env.integration.disable()
    assert "patch_weight_to_device" not in vars(mp.ModelPatcher)
    assert mp.ModelPatcher.patch_weight_to_device is base.patch_weight_to_device


def test_env_var_switches_it_off(comfy_env, monkeypatch):
    monkeypatch.setenv(comfy_env.integration.ENV_VAR, "0")
    original = comfy_env.m["comfy.ops"].cast_bias_weight
    hooks = comfy_env.integration.enable()
    assert not hooks and len(hooks) == 0
    assert comfy_env.m["comfy.ops"].cast_bias_weight is original
    assert not comfy_env.integration.is_enabled()
    with comfy_env.integration.enabled() as on:
        assert not on


def test_context_manager_enables_for_the_block(comfy_env):
    original = comfy_env.m["comfy.ops"].cast_bias_weight
    with comfy_env.integration.enabled(cpu_targets=True) as on:
        assert on and "comfy.ops.cast_bias_weight" in on
        assert comfy_env.m["comfy.ops"].cast_bias_weight is not original
    assert comfy_env.m["comfy.ops"].cast_bias_weight is original


def test_a_missing_hook_point_is_reported_and_without_the_cast_path_pins_says_it_is_inactive(monkeypatch, pins,
                                                                                              caplog):
    import torch_pins.comfy as integration

    modules = _stand_in_comfy(with_executor=False, with_ram_points=False)
    del modules["comfy.ops"].cast_bias_weight
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "execution", raising=False)
    monkeypatch.delenv(integration.ENV_VAR, raising=False)
    with caplog.at_level(logging.INFO, logger="torch_pins.comfy"):
        try:
            hooks = integration.enable()
            off = integration.stats()
        finally:
            integration.disable()
    assert not hooks and not hooks.active and len(hooks) == 0, "inactive: no hook is left in"
    assert not integration.is_enabled() and not off["enabled"], "stats() of pins that stayed off says why"
    assert off["why"] == hooks.reason and off["missing"] == list(hooks.missing) and off["failed"] == {}
    assert "cast_bias_weight" in hooks.reason
    assert "comfy.ops.cast_bias_weight" in hooks.missing
    assert "comfy.model_management.free_memory" in hooks.missing
    missing = hooks.missing
    assert hooks.awaited == ("execution",), "not imported yet: awaited, not missing"
    assert "execution.execute" not in missing
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and "INACTIVE" in r.getMessage()]
    assert len(loud) == 1 and "cast_bias_weight" in loud[0].getMessage()
    assert len([r for r in caplog.records if "lacks" in r.getMessage()]) == 1


def test_enable_without_comfyui_says_so(monkeypatch):
    import torch_pins.comfy as integration

    monkeypatch.delenv(integration.ENV_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "comfy", None)  # import comfy fails
    monkeypatch.setitem(sys.modules, "comfy.model_management", None)
    with pytest.raises(ImportError, match="ComfyUI"):
        integration.enable()
    assert not integration.is_enabled()


def test_patchers_register_one_model_per_weight_module_and_forget_it_with_them(comfy_env):
    comfy_env.integration.enable()
    net, patcher = _net_and_patcher(comfy_env)
    clone = patcher.clone()
    other = comfy_env.m["comfy.model_patcher"].ModelPatcher(TinyNet(comfy_env.m["comfy.ops"]),
                                                            torch.device("cpu"), torch.device("cpu"))
    registered = [c for c in comfy_env.rec.calls if c[0] == "register_model"]
    assert [c[1][0] for c in registered] == ["TinyNet", "TinyNet"]  # pins tells repeated names apart
    # Note [Prewarm]: the size of its weights, what its first prompt is expected to pin.
    assert registered[0][2] == {"fast_disk": False, "size": sum(t.nbytes for t in net.state_dict().values())}
    assert registered[0][2]["size"] > 0
    assert comfy_env.pins.stats()[f"model.{comfy_env.integration.model_id(patcher)}.size"] == registered[0][2]["size"]
    model = comfy_env.integration.model_id(patcher)
    assert model >= 0 and comfy_env.integration.model_id(clone) == model
    assert comfy_env.integration.model_id(net.l1) == model
    assert comfy_env.integration.model_id(other) not in (-1, model)
    assert comfy_env.integration.stats()["models"] == 2
    del net, patcher, clone
    gc.collect()
    assert ("forget_model", (model,), {}) in comfy_env.rec.calls
    assert comfy_env.integration.stats()["models"] == 1


class _Unloaded(torch.nn.Module):
    """A layer made before its weights are loaded, as ComfyUI 0.33's quantized
    ops are: no weight until load_state_dict; state_dict warns until then."""

    def __init__(self, n):
        super().__init__()
        self.n = n
        self.bias = torch.nn.Parameter(torch.zeros(n), requires_grad=False)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.weight = torch.nn.Parameter(torch.empty_like(state_dict[prefix + "weight"]), requires_grad=False)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def state_dict(self, *args, destination=None, prefix="", **kwargs):
        if not hasattr(self, "weight"):
            logging.getLogger("comfy.ops").warning("Warning: state dict on uninitialized op %s", prefix)
        return super().state_dict(*args, destination=destination, prefix=prefix, **kwargs)


def test_registering_a_model_changes_nothing_comfyui_computes_about_it(comfy_env, caplog):
    # ComfyUI 0.33 makes a diffusion model's patcher before it loads the
    # weights: a model_size() from the registration cached the empty model's
    # size in the patcher, and each op without weights logged a warning.
    comfy_env.integration.enable()
    net = torch.nn.Sequential(_Unloaded(64), _Unloaded(64))
    with caplog.at_level(logging.WARNING):
        patcher = comfy_env.m["comfy.model_patcher"].ModelPatcher(net, torch.device("cpu"), torch.device("cpu"))
    assert comfy_env.integration.model_id(patcher) >= 0
    assert patcher.size == 0, "pins asked ComfyUI for the size, which ComfyUI then keeps"
    assert not [r for r in caplog.records if "uninitialized op" in r.getMessage()]
    net.load_state_dict({f"{i}.{k}": torch.randn(64, 64) if k == "weight" else torch.zeros(64)
                         for i in range(2) for k in ("weight", "bias")})
    assert patcher.model_size() == 2 * (64 * 64 + 64) * 4, "ComfyUI's own size of the loaded model"


def test_disable_forgets_the_models(comfy_env):
    comfy_env.integration.enable()
    net, patcher = _net_and_patcher(comfy_env)
    model = comfy_env.integration.model_id(patcher)
    comfy_env.integration.disable()
    assert ("forget_model", (model,), {}) in comfy_env.rec.calls
    with pytest.raises(ValueError):
        comfy_env.pins.forget_model(model)  # already gone


def test_weight_and_bias_go_through_one_gathered_pin_and_hit_from_the_second_step(comfy_env):
    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    model = comfy_env.integration.model_id(patcher)
    assert net.l1.weight.is_inference()
    x = torch.randn(3, 8)
    expected = _plain_forward(net, x)
    hits = []
    for step in range(4):
        before = comfy_env.pins.stats()
        with torch.inference_mode():
            out = net(x)
        after = comfy_env.pins.stats()
        assert torch.equal(out, expected), f"step {step}"
        hits.append(after[f"model.{model}.hits"] - before.get(f"model.{model}.hits", 0))
    assert hits == [0, 2, 2, 2], "two modules: a miss each, then a hit each per step"
    gathered = [c for c in comfy_env.rec.calls if c[0] == "cast_many_to_device"]
    assert len(gathered) == 4 and all(len(c[1][0]) == 2 for c in gathered)
    s = comfy_env.integration.stats()
    assert s["casts"] == 8 and s["gathered"] == 4 and s.get("errors", 0) == 0


def test_without_cpu_targets_a_cpu_cast_stays_comfyuis(comfy_env):
    comfy_env.integration.enable()
    net, _ = _net_and_patcher(comfy_env)
    x = torch.randn(2, 8)
    assert torch.equal(net(x), _plain_forward(net, x))
    assert comfy_env.integration.stats()["fallback.cpu-target"] == 2
    assert "cast_many_to_device" not in comfy_env.rec.names()


def test_unregistered_modules_and_dynamic_vram_modules_fall_back(comfy_env):
    comfy_env.integration.enable(cpu_targets=True)
    ops = comfy_env.m["comfy.ops"]
    loose = ops.Linear(8, 4, dtype=torch.float16)  # no ModelPatcher
    x = torch.randn(2, 8)
    assert torch.equal(loose(x), torch.nn.functional.linear(x, loose.weight.float(), loose.bias.float()))
    net, _ = _net_and_patcher(comfy_env)
    net.l2._v = object()  # ComfyUI's dynamic VRAM pins such modules itself
    net(x)
    s = comfy_env.integration.stats()
    assert s["fallback.unregistered"] == 1
    assert s["fallback.dynamic-vram"] == 1
    assert s["casts"] == 1


def test_a_failing_pins_call_falls_back_to_comfyui_and_is_counted(comfy_env, monkeypatch, caplog):
    comfy_env.integration.enable(cpu_targets=True)
    net, _ = _net_and_patcher(comfy_env)

    def broken(*args, **kwargs):
        raise RuntimeError("no pin today")

    monkeypatch.setattr(comfy_env.rec, "cast_many_to_device", broken, raising=False)
    monkeypatch.setattr(comfy_env.rec, "cast_to_device", broken, raising=False)
    x = torch.randn(2, 8)
    with caplog.at_level(logging.WARNING, logger="torch_pins.comfy"):
        for _ in range(3):
            assert torch.equal(net(x), _plain_forward(net, x))
    assert comfy_env.integration.stats()["errors"] == 6
    assert len([r for r in caplog.records if "no pin today" in r.getMessage()]) == 1


def test_lowvram_patch_factors_go_through_pins_as_patches_with_the_patch_set_signature(comfy_env):
    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    model = comfy_env.integration.model_id(patcher)
    mp = comfy_env.m["comfy.model_patcher"]
    with torch.inference_mode():
        up, down = torch.randn(16, 2, dtype=torch.float16), torch.randn(2, 8, dtype=torch.float16)
    patcher.patches["l1.weight"] = [(0.5, (up, down), 1.0, None, None)]
    net.l1.weight_function = [mp.LowVramPatch("l1.weight", patcher.patches)]
    x = torch.randn(3, 8)
    w1 = net.l1.weight.float() + (0.5 * (up.float() @ down.float()))
    expected = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, net.l1.bias.float())),
                                          net.l2.weight.float())
    for _ in range(3):
        assert torch.equal(net(x), expected)

    def patch_casts():  # positional: source, device, dtype, non_blocking, model, kind, resident, signature
        return [c[1] for c in comfy_env.rec.calls if c[0] == "cast_to_device" and c[1][5:6] == ("patches",)]

    assert len(patch_casts()) == 6
    assert {c[4] for c in patch_casts()} == {model}
    signatures = {c[7] for c in patch_casts()}
    assert len(signatures) == 1 and isinstance(signatures.pop(), int)
    # a new patch set (ComfyUI renews current_weight_patches_uuid) gets a new signature
    import uuid
    net.current_weight_patches_uuid = uuid.uuid4()
    assert torch.equal(net(x), expected)
    assert patch_casts()[-1][7] == net.current_weight_patches_uuid.int & ((1 << 63) - 1)
    # outside a patch function, cast_to_device is ComfyUI's own
    mm = comfy_env.m["comfy.model_management"]
    n = len(comfy_env.rec.calls)
    mm.cast_to_device(up, torch.device("cpu"), torch.float32)
    assert len(comfy_env.rec.calls) == n
    assert comfy_env.integration.stats()["patch_casts"] == 8


def test_copy_to_param_invalidates_so_the_new_bytes_are_served(comfy_env):
    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    utils = comfy_env.m["comfy.utils"]
    x = torch.randn(2, 8)
    net(x), net(x)
    with torch.inference_mode():
        utils.copy_to_param(net, "l1.weight", torch.ones(16, 8, dtype=torch.float16))
    invalidated = [c[1][0] for c in comfy_env.rec.calls if c[0] == "invalidate"]
    assert len(invalidated) == 1 and invalidated[0] is net.l1.weight
    assert torch.equal(net(x), _plain_forward(net, x))
    assert comfy_env.integration.stats()["invalidations"] == 1


def test_patch_weight_to_device_invalidates_what_it_wrote_and_set_attr_param_nothing(comfy_env):
    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    utils = comfy_env.m["comfy.utils"]
    original = net.l2.weight
    utils.set_attr_param(net, "l2.weight", torch.zeros(4, 16, dtype=torch.float16))
    utils.set_attr_param(net, "l2.weight", original)  # a backup restored: its bytes are as they were
    assert "invalidate" not in comfy_env.rec.names()
    with torch.inference_mode():
        patcher.patches["l1.weight"] = [(1.0, (torch.randn(16, 1, dtype=torch.float16),
                                               torch.randn(1, 8, dtype=torch.float16)), 1.0, None, None)]
    patcher.patch_weight_to_device("l1.bias")  # not patched: nothing written, nothing dropped
    assert "invalidate" not in comfy_env.rec.names()
    patcher.patch_weight_to_device("l1.weight")
    assert comfy_env.rec.calls[-1][0] == "invalidate" and comfy_env.rec.calls[-1][1][0] is net.l1.weight


def test_prompt_node_and_model_boundaries(comfy_env):
    comfy_env.integration.enable(cpu_targets=True)
    execution, mm = comfy_env.m["execution"], comfy_env.m["comfy.model_management"]
    net, patcher = _net_and_patcher(comfy_env)
    model = comfy_env.integration.model_id(patcher)
    results = {}

    class Server:
        def run_node(self, prompt, node_id):
            if prompt[node_id] == "sample":
                mm.load_models_gpu([patcher])
                results[node_id] = net(torch.randn(2, 8))

    comfy_env.rec.calls.clear()
    execution.PromptExecutor(Server()).execute({"a": "load", "b": "sample"}, "p1")
    names = comfy_env.rec.names()
    assert names[0] == "mark_prompt" and comfy_env.rec.calls[0][1] == ([],)
    assert names[-1] == "end_prompt"
    assert names.count("end_node") == 2
    marks = [c for c in comfy_env.rec.calls if c[0] == "mark_prompt"]
    assert marks[1][1] == ([model],)
    assert ("set_active", (model, True), {}) in comfy_env.rec.calls
    # the model is marked before ComfyUI loads it, and cast only after
    assert names.index("set_active") < names.index("cast_many_to_device")
    assert names.index("cast_many_to_device") < names.index("end_node", names.index("set_active"))


def test_free_memory_frees_pins_for_ram_before_comfyui_unloads(comfy_env):
    comfy_env.integration.enable(cpu_targets=True, ram_headroom=1 << 30)
    mm = comfy_env.m["comfy.model_management"]
    mm.free_ram_reported = 100 << 20
    mm.free_memory(300 << 20, torch.device("cpu"))
    frees = [c for c in comfy_env.rec.calls if c[0] == "free_pins"]
    assert frees == [("free_pins", (200 << 20,), {})]
    assert mm.calls[-1][0] == "free_memory"
    # enough RAM: nothing freed
    mm.free_ram_reported = 64 << 30
    mm.free_memory(300 << 20, torch.device("cpu"))
    assert len([c for c in comfy_env.rec.calls if c[0] == "free_pins"]) == 1


def test_free_memory_on_an_accelerator_keeps_the_headroom_after_models_came_back_to_ram(comfy_env):
    comfy_env.integration.enable(ram_headroom=1 << 30)
    mm = comfy_env.m["comfy.model_management"]
    mm.free_ram_reported = 256 << 20
    mm.free_memory(8 << 30, torch.device("meta"))  # nothing unloaded: nothing to do
    assert "free_pins" not in comfy_env.rec.names()
    mm.unloads = ["a model"]
    mm.free_memory(8 << 30, torch.device("meta"))
    frees = [c for c in comfy_env.rec.calls if c[0] == "free_pins"]
    assert frees == [("free_pins", ((1 << 30) - (256 << 20),), {})]


def test_newer_cast_bias_weight_signature_gets_its_offloadable_triple(comfy_env):
    ops = comfy_env.m["comfy.ops"]
    older = ops.cast_bias_weight

    def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None, offloadable=False,
                         compute_dtype=None, want_requant=False):
        weight, bias = older(s, input, dtype, device, bias_dtype)
        return (weight, bias, None) if offloadable else (weight, bias)

    ops.cast_bias_weight = cast_bias_weight
    comfy_env.integration.enable(cpu_targets=True)
    net, _ = _net_and_patcher(comfy_env)
    x = torch.randn(2, 8)
    pair = ops.cast_bias_weight(net.l1, x)
    by_position = ops.cast_bias_weight(net.l1, x, None, None, None, True)
    by_keyword = ops.cast_bias_weight(net.l1, x, offloadable=True)
    assert len(pair) == 2 and len(by_position) == 3 and len(by_keyword) == 3
    assert by_position[2] is None and by_keyword[2] is None, "nothing for uncast_bias_weight to wait for"
    assert all(torch.equal(a, b) for a, b in zip(pair, by_keyword[:2]))
    assert comfy_env.integration.stats()["casts"] == 3


def test_a_quantized_wrapper_weight_is_cast_as_itself(comfy_env):
    from test_subclass import ScaledInt8  # a small wrapper subclass with the flatten protocol

    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    model = comfy_env.integration.model_id(patcher)
    with torch.inference_mode():
        q = ScaledInt8.quantize(net.l2.weight)  # dequantizes to fp16; the compute dtype is fp32
    net.l2.weight = torch.nn.Parameter(q, requires_grad=False)
    x = torch.randn(2, 8)
    h = torch.relu(torch.nn.functional.linear(x, net.l1.weight.float(), net.l1.bias.float()))
    expected = torch.nn.functional.linear(h, ScaledInt8(q._qdata, q._scale, torch.float32).dequantize())
    before = comfy_env.pins.stats()
    for _ in range(3):
        assert torch.equal(net(x), expected)
    after = comfy_env.pins.stats()
    wrapper_casts = [c[1][0] for c in comfy_env.rec.calls if c[0] == "cast_to_device"]
    assert all(type(w) is ScaledInt8 for w in wrapper_casts) and len(wrapper_casts) == 3
    assert after[f"model.{model}.misses"] - before.get(f"model.{model}.misses", 0) == 2  # l1, and l2's payload+scale
    assert after[f"model.{model}.hits"] - before.get(f"model.{model}.hits", 0) == 4


# --- enable(): arrival, idempotence, failures, the INFO line (issue 23, audit 1-3, 7) ---

def test_hooks_of_a_module_imported_after_enable_go_in_when_it_arrives(monkeypatch, pins, tmp_path):
    import torch_pins.comfy as integration

    modules = _stand_in_comfy(with_executor=False)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "execution", raising=False)
    monkeypatch.delenv(integration.ENV_VAR, raising=False)
    (tmp_path / "execution.py").write_text(
        "log = []\n"
        "def execute(server, prompt, node_id):\n    log.append(node_id)\n"
        "class PromptExecutor:\n"
        "    def execute(self, prompt, prompt_id):\n"
        "        for node_id in prompt:\n            execute(None, prompt, node_id)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recorder = _Recorder(pins)
    _record_pins_calls(monkeypatch, integration, recorder)
    try:
        hooks = integration.enable(cpu_targets=True)
        assert hooks.active and hooks.awaited == ("execution",)
        assert "execution.execute" not in hooks
        import execution  # ComfyUI's main.py does this; the hooks follow

        assert integration.enable().awaited == ()
        assert {"execution.execute", "execution.PromptExecutor.execute"} <= integration.enable()
        finder = integration.versions.ArrivalFinder
        assert not any(isinstance(f, finder) for f in sys.meta_path), "nothing left to await"
        recorder.calls.clear()
        execution.PromptExecutor().execute(["a", "b"], "p1")
        assert recorder.names() == ["mark_prompt", "end_node", "end_node", "end_prompt"]
    finally:
        integration.disable()
        sys.modules.pop("execution", None)
    assert not any(isinstance(f, integration.versions.ArrivalFinder) for f in sys.meta_path)


class _FailingImport:
    """A finder whose module raises what a missing dependency raises (torchvision)."""

    def __init__(self, name):
        self.name = name

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        import importlib.util

        class Loader:
            def create_module(self, spec):
                return None

            def exec_module(self, module):
                raise ModuleNotFoundError("No module named 'torchvision'", name="torchvision")
        return importlib.util.spec_from_loader(fullname, Loader())


def test_a_module_that_fails_to_import_is_told_from_an_absent_one_and_pins_says_it_is_inactive(monkeypatch, pins,
                                                                                                caplog):
    import torch_pins.comfy as integration

    modules = _stand_in_comfy()
    del modules["comfy.model_patcher"]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "comfy.model_patcher", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_FailingImport("comfy.model_patcher")] + sys.meta_path)
    monkeypatch.delenv(integration.ENV_VAR, raising=False)
    original = modules["comfy.ops"].cast_bias_weight
    with caplog.at_level(logging.INFO, logger="torch_pins.comfy"):
        hooks = integration.enable()
    assert not hooks and not integration.is_enabled()
    assert modules["comfy.ops"].cast_bias_weight is original, "inactive: nothing left hooked"
    assert "torchvision" in hooks.failed["comfy.model_patcher"]
    assert "comfy.model_patcher.ModelPatcher.__init__" not in hooks.missing, "failed, not absent"
    messages = [r.getMessage() for r in caplog.records]
    assert any("importing comfy.model_patcher failed" in m and "torchvision" in m for m in messages)
    assert any("INACTIVE" in m and "torchvision" in m for m in messages
               if "pins is INACTIVE" in m), messages


def test_one_info_line_says_version_mode_hooks_policy_and_budget(comfy_env, caplog):
    cli_args = types.ModuleType("comfy.cli_args")
    cli_args.args = types.SimpleNamespace(cpu=True)
    sys.modules["comfy.cli_args"] = cli_args
    try:
        with caplog.at_level(logging.INFO, logger="torch_pins.comfy"):
            hooks = comfy_env.integration.enable()
    finally:
        del sys.modules["comfy.cli_args"]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "hooks in" in r.getMessage()]
    assert len(lines) == 1
    line = lines[0]
    conf = comfy_env.pins.config()
    for part in (f"torch_pins {comfy_env.pins.__version__}", "active", "old-loader", f"{len(hooks)} hooks in",
                 f"policy {conf['policy']}", "headroom", "pin_reserve"):
        assert part in line, (part, line)
    assert "--cpu" in line and "cpu_targets=True" in line, "pins serves no CPU cast unless asked"


# --- unloads (audit 4) ---

def _with_unloads(env):
    mm = env.m["comfy.model_management"]
    mm.current_loaded = []
    mm.partial_unloads = False

    class LoadedModel:
        def __init__(self, patcher):
            self.model = patcher

        def model_unload(self, memory_to_free=None, unpatch_weights=True):
            return not mm.partial_unloads  # ComfyUI's returns False when a partial unload freed enough

    def unload_all_models():
        for loaded in list(mm.current_loaded):
            loaded.model_unload()
        mm.current_loaded.clear()

    mm.LoadedModel, mm.unload_all_models = LoadedModel, unload_all_models
    return mm


def test_unload_all_models_makes_every_model_inactive_and_frees_every_pin(comfy_env):
    mm = _with_unloads(comfy_env)
    comfy_env.integration.enable(cpu_targets=True)
    pins = comfy_env.pins
    models = []
    for _ in range(2):
        net, patcher = _net_and_patcher(comfy_env)
        mm.load_models_gpu([patcher])
        mm.current_loaded.append(mm.LoadedModel(patcher))
        net(torch.randn(2, 8))
        models.append((net, comfy_env.integration.model_id(patcher)))
    stats = pins.stats()
    assert all(stats[f"model.{m}.active"] == 1 for _, m in models)
    assert sum(stats[f"model.{m}.weights.pins"] for _, m in models) > 0
    mm.unload_all_models()  # ComfyUI's /free
    stats = pins.stats()
    for _, m in models:
        assert stats[f"model.{m}.active"] == 0
        assert all(stats[f"model.{m}.{s}.pins"] == 0 for s in ("weights", "patches", "weights-loaded",
                                                                  "patches-loaded"))
    assert comfy_env.integration.stats()["unload_all"] == 1


def test_a_model_comfyui_unloads_is_inactive_and_keeps_its_pins(comfy_env):
    mm = _with_unloads(comfy_env)
    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    mm.load_models_gpu([patcher])
    net(torch.randn(2, 8))
    model = comfy_env.integration.model_id(patcher)
    pinned = comfy_env.pins.stats()[f"model.{model}.weights.pins"]
    assert mm.LoadedModel(patcher).model_unload() is True
    stats = comfy_env.pins.stats()
    assert stats[f"model.{model}.active"] == 0
    assert stats[f"model.{model}.weights.pins"] == pinned > 0, "the cache it reloads from"


def test_loads_and_unloads_say_how_much_of_the_model_stays_on_the_device(comfy_env):
    """Note [Spared layers on the device]: pins sees the loads' copies, not what
    leaves the device; after each load and each unload (partial or whole) the
    integration says how much of the model ComfyUI keeps there."""
    mm = _with_unloads(comfy_env)
    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    on_device = {"bytes": 0}
    patcher.loaded_size = lambda: on_device["bytes"]  # ComfyUI's: the weight bytes on the load device

    def said():
        return [c[1] for c in comfy_env.rec.calls if c[0] == "set_device_bytes"]

    total = patcher.model_size()
    on_device["bytes"] = total
    mm.load_models_gpu([patcher])
    model = comfy_env.integration.model_id(patcher)
    assert said() == [(model, total, total)]
    # A partial unload (ComfyUI's model_unload returns False): the model stays active.
    mm.partial_unloads = True
    on_device["bytes"] = total // 4
    assert mm.LoadedModel(patcher).model_unload(total) is False
    assert said()[-1] == (model, total // 4, total)
    assert comfy_env.pins.stats()[f"model.{model}.active"] == 1
    # The whole model: inactive, nothing on the device.
    mm.partial_unloads = False
    on_device["bytes"] = 0
    assert mm.LoadedModel(patcher).model_unload() is True
    assert said()[-1] == (model, 0, total)
    assert comfy_env.pins.stats()[f"model.{model}.active"] == 0
    # A patcher without loaded_size (a custom node's own) says nothing.
    del patcher.loaded_size
    n = len(said())
    mm.load_models_gpu([patcher])
    assert len(said()) == n


# --- patch pins across boundaries (audit 5) ---

def test_lowvram_patch_pins_survive_node_and_prompt_ends_while_the_patch_set_is_unchanged(comfy_env):
    comfy_env.integration.enable(cpu_targets=True)
    pins = comfy_env.pins
    net, patcher = _net_and_patcher(comfy_env)
    model = comfy_env.integration.model_id(patcher)
    mp = comfy_env.m["comfy.model_patcher"]
    with torch.inference_mode():
        up, down = torch.randn(16, 2, dtype=torch.float16), torch.randn(2, 8, dtype=torch.float16)
    patcher.patches["l1.weight"] = [(0.5, (up, down), 1.0, None, None)]
    net.l1.weight_function = [mp.LowVramPatch("l1.weight", patcher.patches)]
    x = torch.randn(3, 8)
    first = net(x)
    key = f"model.{model}.patches-loaded"
    assert pins.stats()[f"{key}.pins"] == 2 and pins.stats()[f"{key}.misses"] == 2
    pins.end_node()
    pins.end_prompt()
    assert torch.equal(net(x), first)
    assert pins.stats()[f"{key}.hits"] == 2, "the next prompt's first step hits the factors"
    import uuid
    net.current_weight_patches_uuid = uuid.uuid4()  # a new patch set: made again, never served stale
    net(x)
    assert pins.stats()[f"{key}.misses"] == 4


# --- the old loader: offload stream, ComfyUI's own pins, one budget ---

class _Stream:
    def __init__(self, log):
        self.log = log

    @contextlib.contextmanager
    def as_context(self, stream):
        self.log.append("enter")
        yield
        self.log.append("exit")


def test_offloadable_casts_run_on_comfyuis_offload_stream_and_hand_it_to_uncast(comfy_env):
    ops, mm = comfy_env.m["comfy.ops"], comfy_env.m["comfy.model_management"]
    older = ops.cast_bias_weight

    def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None, offloadable=False,
                         compute_dtype=None, want_requant=False):
        weight, bias = older(s, input, dtype, device, bias_dtype)
        return (weight, bias, None) if offloadable else (weight, bias)

    log = []
    stream = _Stream(log)
    ops.cast_bias_weight = cast_bias_weight
    mm.get_offload_stream = lambda device: stream
    mm.sync_stream = lambda device, s: log.append(("sync", s))
    comfy_env.integration.enable(cpu_targets=True)
    net, _ = _net_and_patcher(comfy_env)
    x = torch.randn(2, 8)
    w, b, handle = ops.cast_bias_weight(net.l1, x, offloadable=True)
    assert handle[0] is stream and handle[1] is w and handle[2] is b
    assert log == ["enter", "exit", ("sync", stream)], "copies on the stream, then the compute stream waits"
    log.clear()
    assert len(ops.cast_bias_weight(net.l1, x)) == 2 and log == [], "not offloadable: the current stream"
    assert comfy_env.integration.stats()["offload_stream_casts"] == 1


def test_comfyui_does_not_page_lock_a_weight_pins_pins(comfy_env):
    mp = comfy_env.m["comfy.model_patcher"]
    locked = []
    mp.ModelPatcher.pin_weight_to_device = lambda self, key: locked.append(key)
    comfy_env.integration.enable(cpu_targets=True)
    net, patcher = _net_and_patcher(comfy_env)
    patcher.pin_weight_to_device("l1.weight")
    assert locked == [] and comfy_env.integration.stats()["declined_pins"] == 1
    other = mp.ModelPatcher.__new__(mp.ModelPatcher)  # never registered
    other.model, other.load_device = torch.nn.Linear(2, 2), torch.device("cpu")
    other.pin_weight_to_device("weight")
    assert locked == ["weight"], "ComfyUI still pins what pins does not serve"


def test_comfyuis_free_pins_frees_pins_along_the_same_tiers_first(comfy_env):
    mm = comfy_env.m["comfy.model_management"]
    comfy = []

    def free_pins(size, evict_active=False, loaded=False):
        comfy.append((size, evict_active, loaded))
        return 0

    mm.free_pins = free_pins
    comfy_env.integration.enable(cpu_targets=True)
    mm.free_pins(4096, loaded=True)
    mm.free_pins(8192, True)
    frees = [c[1] for c in comfy_env.rec.calls if c[0] == "free_pins"]
    assert frees == [(4096, False, True), (8192, True, False)]
    assert comfy == [(4096, False, True), (8192, True, False)], "nothing of pins to free: ComfyUI's own next"


def test_a_page_lock_request_is_not_taken_for_ram_and_the_page_lock_cap_counts_pins(comfy_env):
    mm = comfy_env.m["comfy.model_management"]
    asked = []

    def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False, pins_required=0, ram_required=0):
        return []

    mm.free_memory = free_memory
    mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY = 1 << 30, 1 << 30
    mm.ensure_pin_registerable = lambda size, evict_active=True: asked.append(size) or True
    comfy_env.integration.enable(cpu_targets=True)
    mm.free_ram_reported = 1 << 20
    mm.free_memory(0, torch.device("meta"), pins_required=8 << 30)
    assert "free_pins" not in comfy_env.rec.names(), "pins_required is ComfyUI's ensure_pin_budget's to weigh"
    mm.free_memory(0, torch.device("meta"), ram_required=8 << 30)
    assert [c[1] for c in comfy_env.rec.calls if c[0] == "free_pins"] == [((8 << 30) - (1 << 20),)]
    comfy_env.rec.calls.clear()
    mm.ensure_pin_registerable(4096)
    locked = comfy_env.pins.stats()["locked_bytes"]
    assert [c[1] for c in comfy_env.rec.calls if c[0] == "free_pins"] == [(4096 + locked, True)]
    assert asked == [4096]
    # ComfyUI asks before each page-lock of its own (per layer, when it prefetches):
    # one counter, not every counter.
    assert "locked_bytes" in comfy_env.rec.names() and "stats" not in comfy_env.rec.names()


# --- ComfyUI's own tracking drives the boundaries ---

def test_comfyuis_prompt_tracker_and_cast_buffer_reset_drive_the_boundaries_once(comfy_env):
    mp, mm, execution = comfy_env.m["comfy.model_patcher"], comfy_env.m["comfy.model_management"], \
        comfy_env.m["execution"]
    memory = types.ModuleType("comfy.memory_management")
    memory.aimdo_enabled = False  # on below, after enable(): these stand-ins have no vbar cast path
    sys.modules["comfy.memory_management"] = memory
    net, patcher = _net_and_patcher(comfy_env)

    class PromptModelTracker:
        def __init__(self):
            self.models = {}

        def start(self):
            self.end()

        def add(self, outputs):
            self.models[id(outputs.model)] = outputs

        def end(self):
            self.models.clear()

    mp.PromptModelTracker = PromptModelTracker
    mm.reset_cast_buffers = lambda: None
    tracker = PromptModelTracker()
    run_node = execution.execute

    async def execute(server, prompt, node_id):  # as 0f1fa67a: the node, then reset_cast_buffers under aimdo
        try:
            return await run_node(server, prompt, node_id)
        finally:
            mm.reset_cast_buffers()

    execution.execute = execute
    execute_async = execution.PromptExecutor.execute_async

    async def tracked(self, prompt, prompt_id):
        tracker.start()
        try:
            await execute_async(self, prompt, prompt_id)
        finally:
            tracker.end()

    execution.PromptExecutor.execute_async = tracked

    class Server:
        def run_node(self, prompt, node_id):
            tracker.add(patcher)

    try:
        comfy_env.integration.enable(cpu_targets=True)
        memory.aimdo_enabled = True
        comfy_env.rec.calls.clear()
        execution.PromptExecutor(Server()).execute(["a", "b"], "p1")
    finally:
        del sys.modules["comfy.memory_management"]
    model = comfy_env.integration.model_id(patcher)
    names = comfy_env.rec.names()
    assert names.count("end_prompt") == 1 and names.count("end_node") == 2, names
    assert [c[1] for c in comfy_env.rec.calls if c[0] == "mark_prompt"] == [([],), ([model],), ([model],)]


# --- the dynamic-VRAM cast path (the real one: test_comfy.py against ComfyUI 0.33) ---

def _with_vbar_path(env):
    """comfy.pinned_memory and comfy.model_management.cast_to_gathered shaped as
    ComfyUI 0.33's, and comfy.memory_management with aimdo on: what ComfyUI's
    cast_modules_with_vbar calls for one layer, in its order."""
    mm = env.m["comfy.model_management"]
    pinned = types.ModuleType("comfy.pinned_memory")
    memory = types.ModuleType("comfy.memory_management")
    memory.aimdo_enabled = True
    comfy_pins = {}

    def get_pin(module, subset="weights"):
        return comfy_pins.get((id(module), subset))

    def pin_memory(module, subset="weights", size=None):
        comfy_pins[(id(module), subset)] = torch.empty(size, dtype=torch.uint8)
        return True

    def interpret_gathered_like(tensors, gathered):
        views, offset = [], 0
        for t in tensors:
            if t is None:
                views.append(None)
                continue
            n = t.numel() * t.element_size()
            views.append(gathered[offset:offset + n].view(t.dtype).view(t.shape))
            offset += (n + 1023) // 1024 * 1024
        return views

    def cast_to_gathered(tensors, r, non_blocking=False, stream=None, r2=None):
        mm.gathered.append(len(tensors))
        dest = interpret_gathered_like(tensors, r) if r is not None else [None] * len(tensors)
        dest2 = interpret_gathered_like(tensors, r2) if r2 is not None else [None] * len(tensors)
        for t, d, d2 in zip(tensors, dest, dest2):
            if t is None:
                continue
            if d is not None:
                d.copy_(t)
            if d2 is not None:
                d2.copy_(t if d is None else d)

    def cast_layer(s, resident):
        """cast_modules_with_vbar + resolve for one layer: into its "vbar" slot."""
        size = sum((t.numel() * t.element_size() + 1023) // 1024 * 1024 for t in (s.weight, s.bias)
                   if t is not None)
        dest = torch.empty(size, dtype=torch.uint8)
        subset = "weights"
        pin = pinned.get_pin(s, subset=subset)
        if pin is None:
            loaded = pinned.get_pin(s, subset="weights-loaded")
            if loaded is not None or resident:
                subset, pin = "weights-loaded", loaded
        if pin is not None:
            mm.cast_to_gathered([pin], dest)
        else:
            pinned.pin_memory(s, subset=subset, size=size)
            pin = pinned.get_pin(s, subset=subset)
            mm.cast_to_gathered([s.weight, s.bias], pin, r2=dest)
        return interpret_gathered_like([s.weight, s.bias], dest)

    pinned.get_pin, pinned.pin_memory = get_pin, pin_memory
    memory.interpret_gathered_like = interpret_gathered_like
    mm.cast_to_gathered, mm.gathered = cast_to_gathered, []
    env.m["comfy"].pinned_memory, env.m["comfy"].memory_management = pinned, memory
    sys.modules["comfy.pinned_memory"], sys.modules["comfy.memory_management"] = pinned, memory
    return types.SimpleNamespace(cast_layer=cast_layer, comfy_pins=comfy_pins, mm=mm)


@pytest.mark.parametrize("resident", [True, False])
def test_a_dynamic_layer_is_pinned_by_pins_alone_and_hits_from_the_second_cast(comfy_env, resident):
    vbar = _with_vbar_path(comfy_env)
    try:
        hooks = comfy_env.integration.enable(cpu_targets=True)
        assert hooks.active and hooks.mode == "dynamic-vram"
        net, patcher = _net_and_patcher(comfy_env)
        model = comfy_env.integration.model_id(patcher)
        for _ in range(3):
            w, b = vbar.cast_layer(net.l1, resident)
            assert torch.equal(w, net.l1.weight) and torch.equal(b, net.l1.bias)
    finally:
        del sys.modules["comfy.pinned_memory"], sys.modules["comfy.memory_management"]
    assert vbar.comfy_pins == {}, "ComfyUI made no pin of its own"
    subset = "weights-loaded" if resident else "weights"
    stats = comfy_env.pins.stats()  # weight and bias: one pin
    assert stats[f"model.{model}.{subset}.misses"] == 1 and stats[f"model.{model}.{subset}.hits"] == 2
    s = comfy_env.integration.stats()
    assert s["vbar_casts"] == 3 and s["declined_pins"] == 3 and s.get("errors", 0) == 0, s


def test_a_dynamic_layer_pins_does_not_serve_keeps_comfyuis_own_pin(comfy_env):
    vbar = _with_vbar_path(comfy_env)
    try:
        comfy_env.integration.enable(cpu_targets=True)
        layer = comfy_env.m["comfy.ops"].Linear(8, 4, dtype=torch.float16)  # no patcher: not registered
        w, _ = vbar.cast_layer(layer, True)
        assert torch.equal(w, layer.weight)
    finally:
        del sys.modules["comfy.pinned_memory"], sys.modules["comfy.memory_management"]
    assert list(vbar.comfy_pins) == [(id(layer), "weights-loaded")]
    assert comfy_env.integration.stats().get("vbar_casts", 0) == 0


# --- load_torch_file reads safetensors through pins.load_file (issue 25) ---

def _write_checkpoint(path, metadata=None, **extra):
    """A small checkpoint in the dtypes ComfyUI's models come in, an empty
    tensor among them; its names are not in sorted order in the file."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    sd = {"z.weight": torch.randn(16, 8, generator=g).half(), "a.bias": torch.randn(16, generator=g).bfloat16(),
          "m.scale": torch.randn(4, generator=g), "m.index": torch.arange(6), "m.mask": torch.tensor([True, False]),
          "m.fp8": torch.randn(8, generator=g).to(torch.float8_e4m3fn), "m.empty": torch.zeros(0, 4),
          "b.bytes": torch.arange(7, dtype=torch.uint8), **extra}
    save_file(sd, str(path), metadata=metadata)
    return str(path)


def _bytes(t):
    return t.reshape(-1).view(torch.uint8)


def _assert_same_state_dict(ours, theirs):
    assert list(ours) == list(theirs), "the same keys, in the same order"
    for k in theirs:
        a, b = ours[k], theirs[k]
        assert (a.dtype, a.shape, a.device, a.is_inference()) == (b.dtype, b.shape, b.device, b.is_inference()), k
        assert torch.equal(_bytes(a), _bytes(b)), k


def test_load_torch_file_reads_safetensors_through_pins_as_comfyui_does(comfy_env, tmp_path):
    utils, pins = comfy_env.m["comfy.utils"], comfy_env.pins
    comfy = utils.load_torch_file
    with_metadata = _write_checkpoint(tmp_path / "model.safetensors", {"format": "pt", "modelspec.title": "t"})
    without = _write_checkpoint(tmp_path / "lora.sft")
    hooks = comfy_env.integration.enable()
    assert "comfy.utils.load_torch_file" in hooks
    mapped = pins.stats()["mapped_files"]
    sd, metadata = utils.load_torch_file(with_metadata, return_metadata=True)
    assert pins.stats()["mapped_files"] == mapped + 1, "the tensors lie in pins' mapping of the file"
    assert metadata == {"format": "pt", "modelspec.title": "t"}
    theirs, their_metadata = comfy(with_metadata, return_metadata=True)
    _assert_same_state_dict(sd, theirs)
    assert metadata == their_metadata
    plain = utils.load_torch_file(without)
    assert isinstance(plain, dict), "no metadata asked: the dict alone"
    _assert_same_state_dict(plain, comfy(without))
    assert utils.load_torch_file(without, return_metadata=True)[1] is None is comfy(without, return_metadata=True)[1]
    with torch.inference_mode():  # as ComfyUI's executor runs loaders
        _assert_same_state_dict(utils.load_torch_file(without), comfy(without))
    s = comfy_env.integration.stats()
    assert s["loaded_files"] == 4 and not any(k.startswith("load_fallback.") for k in s), s
    assert comfy_env.rec.names().count("load_file") == 4
    assert utils.loads == [with_metadata, without, without, without], "ComfyUI's loader ran only when called itself"


def test_a_weight_loaded_through_pins_is_pinned_from_the_file_and_not_without_the_hook(comfy_env, tmp_path):
    from safetensors.torch import save_file

    ops, mp, pins = comfy_env.m["comfy.ops"], comfy_env.m["comfy.model_patcher"], comfy_env.pins
    path = str(tmp_path / "net.safetensors")
    save_file({k: v.detach().clone() for k, v in TinyNet(ops).state_dict().items()}, path)
    x = torch.randn(2, 8)
    filled = {}
    for load_files in (True, False):
        comfy_env.integration.enable(cpu_targets=True, load_files=load_files)
        net = TinyNet(ops)
        net.load_state_dict(comfy_env.m["comfy.utils"].load_torch_file(path), assign=True)  # as dynamic VRAM loads
        mp.ModelPatcher(net, torch.device("cpu"), torch.device("cpu"))
        before = pins.stats()["file_fills"]
        assert torch.allclose(net(x), _plain_forward(net, x), atol=1e-3)
        filled[load_files] = pins.stats()["file_fills"] - before
        comfy_env.integration.disable()
    assert filled == {True: 3, False: 0}, "l1's weight and bias (one pin), l2's weight: each read from the file"


def test_files_pins_does_not_read_stay_comfyuis(comfy_env, tmp_path):
    utils = comfy_env.m["comfy.utils"]
    comfy = utils.load_torch_file
    ckpt = str(tmp_path / "model.ckpt")
    torch.save({"w": torch.arange(4.0)}, ckpt)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    nvfp4 = _write_checkpoint(tmp_path / "nvfp4.safetensors",
                              q=torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
    safetensors_file = _write_checkpoint(tmp_path / "model.safetensors")
    with pytest.raises(Exception) as theirs:
        comfy(str(bad))
    comfy_env.integration.enable()
    utils.loads.clear()
    assert torch.equal(utils.load_torch_file(ckpt)["w"], torch.arange(4.0))
    _assert_same_state_dict(utils.load_torch_file(nvfp4), comfy(nvfp4))  # F4: pins has no dtype for it
    with pytest.raises(type(theirs.value)) as ours:
        utils.load_torch_file(str(bad))
    assert str(ours.value) == str(theirs.value), "ComfyUI's own error"
    meta = utils.load_torch_file(safetensors_file, device=torch.device("meta"))
    assert all(t.device.type == "meta" for t in meta.values()), "another device: ComfyUI's loader moves them"
    utils.DISABLE_MMAP = True
    utils.load_torch_file(safetensors_file)
    assert utils.loads == [ckpt, nvfp4, nvfp4, str(bad), safetensors_file, safetensors_file]
    s = comfy_env.integration.stats()
    assert {k: v for k, v in s.items() if k.startswith("load_fallback.")} == {
        "load_fallback.not-safetensors": 1, "load_fallback.refused": 2, "load_fallback.device": 1,
        "load_fallback.disable-mmap": 1}, s
    assert s.get("loaded_files", 0) == 0
    assert comfy_env.rec.names().count("load_file") == 2, "the refused two only"


def test_under_dynamic_vram_the_dict_is_load_safetensors_own(comfy_env, monkeypatch, tmp_path):
    import json
    import struct

    import safetensors

    utils = comfy_env.m["comfy.utils"]
    memory = types.ModuleType("comfy.memory_management")
    monkeypatch.setitem(sys.modules, "comfy.memory_management", memory)
    known = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "C64",
             "U64", "U32", "U16"}  # no F8_E8M0

    def load_safetensors(ckpt):
        """The header's order and its __metadata__ ({} without one); a dtype it
        does not know is a KeyError."""
        with open(ckpt, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        sd = {}
        with safetensors.safe_open(ckpt, framework="pt", device="cpu") as f:
            for k, v in header.items():
                if k != "__metadata__":
                    utils._TYPES[v["dtype"]]  # noqa: B018
                    sd[k] = f.get_tensor(k)
        return sd, header.get("__metadata__", {})

    utils.load_safetensors, utils._TYPES = load_safetensors, dict.fromkeys(known)
    utils.DISABLE_MMAP = True  # the dynamic path maps anyway
    comfy = utils.load_torch_file
    path = _write_checkpoint(tmp_path / "model.safetensors")
    e8m0 = _write_checkpoint(tmp_path / "e8m0.safetensors", s=torch.ones(4).to(torch.float8_e8m0fnu))
    comfy_env.integration.enable()
    memory.aimdo_enabled = True  # read by load_torch_file at each call, as ComfyUI reads it
    sd, metadata = utils.load_torch_file(path, return_metadata=True)
    theirs, their_metadata = comfy(path, return_metadata=True)
    assert list(theirs) != sorted(theirs), "the header's order, not safe_open's"
    _assert_same_state_dict(sd, theirs)
    assert metadata == their_metadata == {}
    with pytest.raises(KeyError):
        utils.load_torch_file(e8m0)
    s = comfy_env.integration.stats()
    assert s["loaded_files"] == 1 and s["load_fallback.dtype"] == 1, s


def test_a_module_holding_load_torch_file_by_name_is_hooked_and_restored_to_comfyuis(comfy_env, monkeypatch,
                                                                                      tmp_path):
    utils, pins = comfy_env.m["comfy.utils"], comfy_env.pins
    comfy = utils.load_torch_file
    hooks = comfy_env.integration.enable(load_files=False)
    assert "comfy.utils.load_torch_file" not in hooks and utils.load_torch_file is comfy
    comfy_env.integration.disable()
    comfy_env.integration.enable()
    # comfy.clip_vision imported after the hook went in: `from .utils import load_torch_file` took ours
    clip_vision = types.ModuleType("comfy.clip_vision")
    clip_vision.load_torch_file = utils.load_torch_file
    monkeypatch.setitem(sys.modules, "comfy.clip_vision", clip_vision)
    assert "comfy.clip_vision.load_torch_file" in comfy_env.integration.enable()
    path = _write_checkpoint(tmp_path / "clip_vision.safetensors")
    mapped = pins.stats()["mapped_files"]
    sd = clip_vision.load_torch_file(path)
    assert pins.stats()["mapped_files"] == mapped + 1 and comfy_env.integration.stats()["loaded_files"] == 1
    _assert_same_state_dict(sd, comfy(path))
    comfy_env.integration.disable()
    assert clip_vision.load_torch_file is comfy and utils.load_torch_file is comfy, "ComfyUI's own, not ours"


# --- torch.compile of a model pins serves (issue 35; the real node: test_comfy.py) ---

def test_a_compiled_model_compiles_as_often_with_pins_as_without_and_gives_the_same_values(comfy_env, monkeypatch,
                                                                                          fresh_compile):
    # Note [Bookkeeping under torch.compile]: the hooks' counters were guards
    # of the compiled frame, so each call recompiled. The recorder stands
    # aside: the real pins module, as in ComfyUI.
    from torch._dynamo.utils import counters

    _record_pins_calls(monkeypatch, comfy_env.integration, comfy_env.pins)
    net, patcher = _net_and_patcher(comfy_env)
    inputs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(i)) for i in range(4)]

    def run():
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(net)  # inductor, as ComfyUI's TorchCompileModel
        with torch.no_grad():
            outputs = [compiled(x) for x in inputs]
        return outputs, counters["frames"]["total"]

    plain, plain_frames = run()
    assert comfy_env.integration.enable(cpu_targets=True)
    comfy_env.m["comfy.model_management"].load_models_gpu([patcher])  # registers it, as ComfyUI's loads do
    model = comfy_env.integration.model_id(patcher)
    before = comfy_env.pins.stats()
    served, frames = run()
    after = comfy_env.pins.stats()
    assert frames == plain_frames == 1, (frames, plain_frames)
    assert all(torch.equal(a, b) for a, b in zip(served, plain)), "pins changed a compiled output"
    misses = after[f"model.{model}.misses"] - before.get(f"model.{model}.misses", 0)
    hits = after[f"model.{model}.hits"] - before.get(f"model.{model}.hits", 0)
    assert misses == 2 and hits == 2 * (len(inputs) - 1), (misses, hits)  # l1 gathered, l2: pinned once


# --- ComfyUI-GGUF's layers (issue 35; the real node: test_comfy.py) ---

GGUF_NODE = os.path.join(os.path.dirname(__file__), "standins", "comfyui_gguf")


def _write_gguf(path, gguf):
    """Five layers of 8 x 64, their weights Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1,
    their biases F16 and F32 in turn."""
    import numpy as np

    g = np.random.default_rng(3)
    writer = gguf.GGUFWriter(str(path), "test")
    for i, name in enumerate(["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]):
        qtype = gguf.GGMLQuantizationType[name]
        writer.add_tensor(f"{i}.weight", gguf.quants.quantize(g.standard_normal((8, 64), np.float32) / 8, qtype),
                          raw_dtype=qtype)
        writer.add_tensor(f"{i}.bias", g.standard_normal(8, np.float32).astype(np.float16 if i % 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def gguf_node(comfy_env):
    """The stand-in ComfyUI-GGUF, loaded as ComfyUI loads a custom node (with
    pins enabled: its hooks go in as it arrives); gone from sys.modules after."""
    gguf = pytest.importorskip("gguf", reason="GGUF files are written with the gguf package")
    comfy_env.integration.enable(cpu_targets=True)
    assert "ComfyUI-GGUF.ops.GGMLTensor.to" not in comfy_env.integration.stats()["hooks"]
    name = GGUF_NODE.replace(".", "_x_")
    asyncio.run(comfy_env.m["nodes"].load_custom_node(GGUF_NODE))
    try:
        yield types.SimpleNamespace(gguf=gguf, ops=sys.modules[name + ".ops"], loader=sys.modules[name + ".loader"])
    finally:
        comfy_env.integration.disable()
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def test_a_gguf_layer_casts_through_pins_keeping_its_quantization_and_hits_from_the_second_step(
        comfy_env, gguf_node, tmp_path):
    hooks = comfy_env.integration.stats()["hooks"]
    assert {"ComfyUI-GGUF.ops.GGMLLayer.cast_bias_weight", "ComfyUI-GGUF.ops.GGMLTensor.to"} <= set(hooks)
    _write_gguf(tmp_path / "t.gguf", gguf_node.gguf)
    net = torch.nn.Sequential(*(gguf_node.ops.Linear(64, 8) for _ in range(5)))
    net.load_state_dict(gguf_node.loader.gguf_sd_loader(str(tmp_path / "t.gguf")))
    assert all(l.is_ggml_quantized() for l in net)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))

    def run():
        with torch.inference_mode():
            return [torch.cat([layer(x) for layer in net]) for _ in range(3)]

    comfy_env.integration.disable()
    plain = run()
    want = torch.cat([x @ gguf_node.ops.dequantize_tensor(l.weight, torch.float32).t()
                      + l.bias.as_subclass(torch.Tensor).float() for l in net])
    assert torch.equal(plain[0], want), "the stand-in dequantizes"
    comfy_env.integration.enable(cpu_targets=True)  # the node is loaded already: its hooks are found
    patcher = comfy_env.m["comfy.model_patcher"].ModelPatcher(net, torch.device("cpu"), torch.device("cpu"))
    model = comfy_env.integration.model_id(patcher)
    steps = []
    for _ in range(3):
        before = comfy_env.pins.stats()
        steps.append((run()[0], before, comfy_env.pins.stats()))
    assert all(torch.equal(out, plain[0]) for out, _, _ in steps), "pins changed a dequantized output"
    misses = [a[f"model.{model}.misses"] - b.get(f"model.{model}.misses", 0) for _, b, a in steps]
    hits = [a[f"model.{model}.hits"] - b.get(f"model.{model}.hits", 0) for _, b, a in steps]
    assert misses == [10, 0, 0] and hits == [2 * 10, 3 * 10, 3 * 10], (misses, hits)  # weight and bias of 5 layers
    s = comfy_env.integration.stats()
    assert s["gguf_casts"] == 3 * 3 * 10 and s.get("errors", 0) == 0, s


def test_a_gguf_weight_moved_through_pins_is_what_its_to_gives(comfy_env, gguf_node, tmp_path):
    _write_gguf(tmp_path / "t.gguf", gguf_node.gguf)
    layer = gguf_node.ops.Linear(64, 8)
    sd = gguf_node.loader.gguf_sd_loader(str(tmp_path / "t.gguf"))
    layer.load_state_dict({k[2:]: v for k, v in sd.items() if k.startswith("1.")})
    layer.weight.patches = [("lora", 0.5)]
    comfy_env.m["comfy.model_patcher"].ModelPatcher(layer, torch.device("cpu"), torch.device("cpu"))
    seen = []
    layer.get_weight = lambda tensor, dtype: seen.append(tensor) or gguf_node.ops.dequantize_tensor(tensor, dtype)
    layer.cast_bias_weight(torch.zeros(1, 64))
    want = layer.weight.to("cpu")
    bias, weight = seen
    assert type(weight) is gguf_node.ops.GGMLTensor and weight is not layer.weight, "moved through pins"
    assert (weight.tensor_type, weight.tensor_shape) == (want.tensor_type, want.tensor_shape) == \
        (gguf_node.gguf.GGMLQuantizationType.Q4_0, torch.Size([8, 64]))
    assert weight.patches == [("lora", 0.5)] and weight.patches is not layer.weight.patches
    assert torch.equal(weight.as_subclass(torch.Tensor), layer.weight.as_subclass(torch.Tensor))
    assert bias.tensor_type == gguf_node.gguf.GGMLQuantizationType.F16 and bias is not layer.bias
