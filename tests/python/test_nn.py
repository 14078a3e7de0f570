"""torch_pins.nn: a torch.nn.Module streams its weights through pins (Note
[Streamed modules]). On the CPU: the device copies are CPU copies made through
pins, so every value must equal the plain module's, bit for bit."""
import gc
import os
import threading

import pytest
import torch
from torch import nn

from nn_models import Block, Net, block_units


def delta(pins, before, key):
    return pins.stats().get(key, 0) - before.get(key, 0)


def hooks_of(module):
    return {name: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for name, m in module.named_modules()}


@pytest.fixture
def nn_pins(pins):
    import torch_pins.nn as pnn
    yield pnn
    for m in list(pnn._roots.keys()):
        pnn.unstream(m)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_outputs_are_the_plain_modules_and_hits_come_from_the_second_call(pins, nn_pins, level, grad_mode):
    net = Net().eval()
    x = torch.randn(5, 4)
    with grad_mode():
        want = net(x)
    s = pins.stream(net, "cpu", level=level)
    units = len(s.units)
    assert units == (7 if level == "block" else 16), s.units
    before = pins.stats()
    with grad_mode():
        got = net(x)
    assert torch.equal(got, want)
    assert delta(pins, before, f"model.{s.model}.misses") == units, "one pin per unit, made at its first cast"
    assert delta(pins, before, f"model.{s.model}.pins") == units
    before = pins.stats()
    with grad_mode():
        for _ in range(2):
            assert torch.equal(net(x), want)
    assert delta(pins, before, f"model.{s.model}.hits") == 2 * units
    assert delta(pins, before, f"model.{s.model}.misses") == 0
    assert s.stats()["gathered"] == 3 * units and s.stats()["single"] == 0, "one gathered transfer per unit"
    assert s.stats()["calls"] == 3


def test_units_follow_the_containers():
    import torch_pins.nn as pnn
    net = Net(n=2)
    assert [name for name, _, _ in pnn._units.split(net, "block")] == block_units(2)
    # A module that holds a container further down is split too; its own tensors are a unit.
    outer = nn.Module()
    outer.inner = net
    outer.gain = nn.Parameter(torch.ones(1))
    assert [name for name, _, _ in pnn._units.split(outer, "block")] == \
        [""] + ["inner" + (f".{u}" if u else "") for u in block_units(2)]
    leaf = [name for name, _, _ in pnn._units.split(net, "leaf")]
    assert leaf == ["", "embed", "blocks.0", "blocks.0.norm", "blocks.0.up", "blocks.0.down", "blocks.1",
                    "blocks.1.norm", "blocks.1.up", "blocks.1.down", "head.0", "head.1"]
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    assert [name for name, _, _ in pnn._units.split(seq, "block")] == ["0", "2"]
    # A container's element is one block, a Sequential of layers too.
    stacked = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), nn.ModuleList([nn.Linear(2, 2)]))
    units = pnn._units.split(stacked, "block")
    assert [(name, len(modules)) for name, _, modules in units] == [("0", 2), ("1", 1)]


class Probe(nn.Module):
    """Records, in its forward, whether each block of `net` holds its own CPU parameters."""

    def __init__(self, inner, net, originals, log):
        super().__init__()
        self.inner = inner
        self.look = (net, originals, log)  # a tuple: not registered as submodules

    def forward(self, x):
        net, originals, log = self.look
        log.append([b.up.weight is originals[i] for i, b in enumerate(net.blocks)])
        return self.inner(x)


def test_a_blocks_copies_replace_its_tensors_for_its_forward_only(pins, nn_pins):
    net = Net(n=3).eval()
    originals = [b.up.weight for b in net.blocks]
    log = []
    for i, b in enumerate(net.blocks):
        b.norm = Probe(b.norm, net, originals, log)
    pins.stream(net, "cpu")
    with torch.no_grad():
        net(torch.randn(2, 4))
    # In block i's forward, block i holds a copy; every other block its own tensors.
    assert log == [[i != j for j in range(3)] for i in range(3)]
    assert all(b.up.weight is originals[i] for i, b in enumerate(net.blocks)), "released after the forward"


def test_unstream_restores_the_module_exactly(pins, nn_pins):
    net = Net().eval()
    before_hooks = hooks_of(net)
    tensors = {k: (v, v.clone()) for k, v in list(net.named_parameters()) + list(net.named_buffers())}
    models = pins.stats()["models"]
    s = pins.stream(net, "cpu", name="restored")
    assert pins.stats()["models"] == models + 1 and pins.stats()["model.restored.size"] > 0
    assert hooks_of(net) != before_hooks
    with torch.no_grad():
        net(torch.randn(2, 4))
    pins.unstream(net)
    assert hooks_of(net) == before_hooks, "every hook removed"
    for k, (t, value) in tensors.items():
        now = net.get_parameter(k) if isinstance(t, nn.Parameter) else net.get_buffer(k)
        assert now is t and torch.equal(now, value), k
    assert pins.stats()["models"] == models, "the model stream() registered is forgotten, its pins freed"
    assert nn_pins.streaming(net) is None
    pins.stream(net, "cpu")  # and can be streamed again
    with pytest.raises(ValueError, match="is not streamed"):
        pins.unstream(nn.Linear(2, 2))
    s.remove()  # removing twice does nothing


def test_a_module_that_dies_forgets_its_model(pins, nn_pins):
    models = pins.stats()["models"]
    net = Net()
    pins.stream(net, "cpu")
    assert pins.stats()["models"] == models + 1
    del net
    gc.collect()
    assert pins.stats()["models"] == models


def test_a_given_model_is_used_and_kept(pins, nn_pins, model):
    net = Net().eval()
    s = pins.stream(net, "cpu", model=model)
    assert s.model == model
    with torch.no_grad():
        net(torch.randn(2, 4))
    assert pins.stats()[f"model.{model}.pins"] == 7
    pins.unstream(net)
    assert pins.stats()[f"model.{model}.pins"] == 7, "the caller's model keeps its pins"


def test_modules_loaded_with_load_file_fill_their_pins_from_the_file(pins, nn_pins, tmp_path):
    from safetensors.torch import save_file
    net = Net().eval()
    path = str(tmp_path / "net.safetensors")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, path)
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = net(x)
    loaded = Net(seed=1).eval()
    loaded.load_state_dict(pins.load_file(path), assign=True)
    before = pins.stats()
    pins.stream(loaded, "cpu")
    with torch.inference_mode():
        assert torch.equal(loaded(x), want)
        assert torch.equal(loaded(x), want)
    assert delta(pins, before, "file_fills") == len(net.state_dict()), "every tensor of every pin read from the file"
    assert delta(pins, before, "hits") == 7


def test_torch_compile_of_a_streamed_module(pins, nn_pins):
    import torch._dynamo
    net = Net().eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = net(x)
    s = pins.stream(net, "cpu")
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        compiled = torch.compile(net, backend=backend)
        before = pins.stats()
        with torch.no_grad():
            assert torch.equal(compiled(x), want)
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            for _ in range(2):
                assert torch.equal(compiled(x), want)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, f"{backend}: no recompile per call"
        assert delta(pins, before, f"model.{s.model}.hits") >= 2 * 7, backend
    torch._dynamo.reset()


def test_inductor_compiles_what_runs_between_the_hooks(pins, nn_pins):
    """The hooks are not traced (Note [Streamed modules]), so inductor compiles
    the blocks' forwards, whatever it does with the pins ops themselves."""
    import torch._dynamo
    net = Net().eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = net(x)
    s = pins.stream(net, "cpu")
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="inductor")
    with torch.no_grad():
        for _ in range(2):
            assert torch.allclose(compiled(x), want, rtol=1e-5, atol=1e-6)  # fused kernels: not bit for bit
    assert s.stats()["calls"] == 2 and pins.stats()[f"model.{s.model}.hits"] == 7
    torch._dynamo.reset()


def test_weights_patched_between_calls_follow_the_staleness_contract(pins, nn_pins):
    net = Net().eval()
    plain = Net().eval()
    x = torch.randn(2, 4)
    s = pins.stream(net, "cpu")
    with torch.no_grad():
        net(x)
        # A write the version counter sees: re-pinned by itself.
        for m in (net, plain):
            m.blocks[1].up.weight.add_(0.25)
        before = pins.stats()
        assert torch.equal(net(x), plain(x))
        assert delta(pins, before, f"model.{s.model}.misses") == 1
        # A write it does not see (.data): the caller invalidates.
        for m in (net, plain):
            m.blocks[2].down.weight.data.mul_(-1)
        pins.invalidate(net.blocks[2].down.weight)
        assert torch.equal(net(x), plain(x))


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        self.calls.add_(1)
        self.ema.mul_(0.5).add_(x.mean(0))
        return self.lin(x) + self.ema


def test_buffers_written_in_a_forward_are_written_back(pins, nn_pins):
    def make():
        torch.manual_seed(3)
        return nn.Sequential(Counter(), Counter()).eval()
    net, plain = make(), make()
    s = pins.stream(net, "cpu")
    x = torch.randn(6, 4)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(net(x), plain(x))
    assert net[0].calls.item() == 3 and torch.equal(net[1].ema, plain[1].ema)
    assert s.stats()["written_back"] == 3 * 2 * 2


def test_batch_norm_in_training_mode_is_refused(pins, nn_pins):
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))  # training mode
    pins.stream(net, "cpu")
    with torch.no_grad(), pytest.raises(RuntimeError, match="BatchNorm1d '1' is in training mode"):
        net(torch.randn(6, 4))
    net.eval()
    with torch.no_grad():
        net(torch.randn(6, 4))


def test_tied_weights_are_cast_alone_in_each_unit(pins, nn_pins):
    net = Net(n=2).eval()
    net.blocks[1].up.weight = net.blocks[0].up.weight
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = net(x)
    s = pins.stream(net, "cpu")
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(net(x), want)
    assert s.stats()["single"] == 2 * 2
    assert pins.stats()[f"model.{s.model}.pins"] == 6 + 1, "the tied weight is one pin of its own"


def test_an_exception_in_a_forward_puts_everything_back(pins, nn_pins):
    net = Net().eval()
    originals = {k: v for k, v in net.named_parameters()}
    s = pins.stream(net, "cpu")
    net.order = [0, 7]  # blocks[7] does not exist
    with torch.no_grad(), pytest.raises(IndexError):
        net(torch.randn(2, 4))
    assert all(net.get_parameter(k) is v for k, v in originals.items())
    net.order = None
    with torch.no_grad():
        net(torch.randn(2, 4))
    assert s._depth == 0 and all(u.depth == 0 and not u.saved for u in s._units)


def test_a_submodule_called_alone_streams_too(pins, nn_pins):
    net = Net().eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        want = net.blocks[1](x)
    s = pins.stream(net, "cpu")
    with torch.no_grad():
        assert torch.equal(net.blocks[1](x), want)
    assert s.stats()["calls"] == 1 and net.blocks[1].up.weight.__class__ is nn.Parameter


def test_a_second_thread_is_refused_while_a_forward_runs(pins, nn_pins):
    net = Net().eval()
    started, release = threading.Event(), threading.Event()

    class Wait(nn.Module):
        def forward(self, x):
            started.set()
            release.wait(10)
            return x
    net.blocks[0].norm = nn.Sequential(Wait(), net.blocks[0].norm)
    pins.stream(net, "cpu")
    errors = []

    def run():
        with torch.no_grad():
            net(torch.randn(2, 4))
    t = threading.Thread(target=run)
    t.start()
    assert started.wait(10)
    try:
        with torch.no_grad(), pytest.raises(RuntimeError, match="another thread"):
            net(torch.randn(2, 4))
    finally:
        release.set()
        t.join()
    with torch.no_grad():
        net(torch.randn(2, 4))  # the first call ended cleanly
    assert not errors


def test_bad_input_is_refused_with_the_value(pins, nn_pins):
    with pytest.raises(ValueError, match="module must be a torch.nn.Module, got Tensor"):
        pins.stream(torch.ones(2), "cpu")
    with pytest.raises(ValueError, match="level must be one of block, leaf, got 'layer'"):
        pins.stream(Net(), "cpu", level="layer")
    for bad in (-1, True, "2", 1.5):
        with pytest.raises(ValueError, match="prefetch must be None or an int >= 0"):
            pins.stream(Net(), "cpu", prefetch=bad)
    with pytest.raises(ValueError, match="model must be None or a registered model id, got str"):
        pins.stream(Net(), "cpu", model="unet")
    net = Net()
    pins.stream(net, "cpu")
    with pytest.raises(ValueError, match="already streamed"):
        pins.stream(net, "cpu")
    outer = nn.Sequential(net)
    with pytest.raises(ValueError, match="already streamed .its submodule '0'"):
        pins.stream(outer, "cpu")
    hooked = Net()
    hooked.blocks[0]._hf_hook = object()
    with pytest.raises(ValueError, match="accelerate's hook object on blocks.0"):
        pins.stream(hooked, "cpu")


def test_grad_mode_on_parameters_that_require_grad_is_refused(pins, nn_pins):
    net = Net()
    pins.stream(net, "cpu")
    with pytest.raises(RuntimeError, match="requires grad and grad mode is on"):
        net(torch.randn(2, 4))
    assert all(isinstance(p, nn.Parameter) for p in net.parameters())
    net.requires_grad_(False)
    net(torch.randn(2, 4))  # nothing to differentiate: allowed


def test_tensors_on_another_device_are_refused(pins, nn_pins):
    net = Net().eval()
    net.blocks[0].up.weight = nn.Parameter(torch.empty(32, 16, device="meta"))
    pins.stream(net, "cpu")
    with torch.no_grad(), pytest.raises(ValueError, match="'weight' of blocks.0 is on meta"):
        net(torch.randn(2, 4))
