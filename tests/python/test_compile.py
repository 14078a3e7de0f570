"""torch.compile of modules that cast through pins: inductor (torch.compile's
default backend) and aot_eager, in the forms users write (torch.compile(module),
mode="max-autotune-no-cudagraphs", dynamic=True, fullgraph on and off). Each
compiled module gives eager's values, runs the real op (hits from the second
call) and compiles as often as the same module with plain .to() casts: Dynamo's
graph count is asserted against that reference."""
import pytest
import torch
from torch._dynamo.utils import counters

# (compile kwargs, the name the test shows): the forms users write.
FORMS = [
    ({}, "default"),
    ({"fullgraph": True}, "fullgraph"),
    ({"mode": "max-autotune-no-cudagraphs"}, "max-autotune-no-cudagraphs"),
    ({"dynamic": True}, "dynamic"),
    ({"backend": "aot_eager", "fullgraph": True}, "aot_eager"),
]


@pytest.fixture(autouse=True)
def _fresh(fresh_compile):
    yield


class Layer(torch.nn.Module):
    """A linear layer whose fp16 weights are cast to the input's dtype: through
    pins (each of pins' cast ops once) or, as the reference, with .to()."""

    def __init__(self, pins, model):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter((torch.randn(16, 8, generator=g) / 4).half(), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(16, generator=g).half(), requires_grad=False)
        self.scale = torch.nn.Parameter(torch.rand(16, generator=g).half() + 0.5, requires_grad=False)
        self.pins, self.model = pins, model

    def forward(self, x):
        if self.pins is None:
            w, b = self.weight.to(x.device, x.dtype), self.bias.to(x.device, x.dtype)
            s = self.scale.to(x.device, x.dtype)
            shift = self.bias.to(x.device, x.dtype)
        else:
            w, b = self.pins.cast_many_to_device([self.weight, self.bias], x.device, x.dtype, model=self.model)
            s = self.pins.cast_to_device(self.scale, x.device, x.dtype, model=self.model)
            shift = torch.empty(16, dtype=x.dtype, device=x.device)
            self.pins.cast_to_device(self.bias, x.device, x.dtype, model=self.model, out=shift)
        return torch.nn.functional.linear(x, w, b) * s - shift


def _run(module, inputs, **compile_kwargs):
    """The compiled module's outputs for ``inputs`` and the graphs Dynamo made."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, **compile_kwargs)
    outputs = [compiled(x) for x in inputs]
    return outputs, counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("kwargs,form", FORMS, ids=[f for _, f in FORMS])
def test_a_compiled_module_casts_through_pins_and_compiles_as_often_as_without(pins, model, kwargs, form):
    layer = Layer(pins, model)
    plain = Layer(None, model)
    plain.load_state_dict(layer.state_dict())
    # The same shape three times, then another batch size (Dynamo makes the
    # graph dynamic then, unless it is from the start).
    inputs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    inputs.append(torch.randn(6, 8))
    want, plain_graphs = _run(plain, inputs, **kwargs)
    before = pins.stats()
    got, graphs = _run(layer, inputs, **kwargs)
    after = pins.stats()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert graphs == plain_graphs, f"{form}: {graphs} graphs with pins, {plain_graphs} with .to()"
    key = f"model.{model}"
    # The first call pins the gathered weight and bias, the scale and the bias
    # again (its own pin); every later call hits all three.
    misses = after[f"{key}.misses"] - before.get(f"{key}.misses", 0)
    hits = after[f"{key}.hits"] - before.get(f"{key}.hits", 0)
    assert misses == 3 and hits == 3 * (len(inputs) - 1), (form, misses, hits)


def test_the_reported_lambda_compiles_with_inductor(pins, model):
    # Issue 35's reproduction: inductor once failed here, passing kind, resident
    # and signature to cast_to_device.out both positionally and as keywords.
    w = torch.randn(8, 8, dtype=torch.float16)
    f = torch.compile(lambda x: pins.cast_to_device(w, "cpu", dtype=torch.float32, model=model) @ x)
    for _ in range(2):
        assert torch.equal(f(torch.eye(8)), w.float())


@pytest.mark.parametrize("args", [{}, {"kind": "patches", "resident": True, "signature": 7},
                                  {"resident": True}], ids=["defaults", "patches", "resident"])
def test_each_argument_form_compiles_with_inductor(pins, model, args):
    # Trailing defaults left out of the call and given explicitly, as the
    # dispatcher records them either way.
    w = torch.randn(4, 4)
    f = torch.compile(lambda x: pins.cast_to_device(w, "cpu", torch.float16, False, model, **args) + x,
                      fullgraph=True)
    assert torch.equal(f(torch.zeros(4, 4, dtype=torch.float16)), w.half())


def test_the_host_calls_run_at_every_call_of_a_compiled_function(pins, model):
    # Note [Host calls under torch.compile]: AOTAutograd once ran them while
    # tracing only, so from the second call on no prompt was marked, no node
    # ended and nothing was invalidated.
    w = torch.randn(4, 4)

    def step(x):
        pins.mark_prompt([model])
        pins.set_active(model, True)
        y = pins.cast_to_device(w, "cpu", torch.float16, model=model)
        pins.invalidate(w)  # the pin just made is dropped: the next call pins again
        pins.end_node()
        return y + x

    for backend in ("inductor", "aot_eager"):
        torch._dynamo.reset()
        compiled = torch.compile(step, backend=backend)
        for _ in range(3):
            pins.end_prompt()
            pins.set_active(model, False)
            before = pins.stats()
            assert torch.equal(compiled(torch.zeros(4, 4, dtype=torch.float16)), w.half())
            s = pins.stats()
            assert s[f"model.{model}.in_prompt"] == 1 and s["prompt"] == 1, backend
            assert s[f"model.{model}.active"] == 0, f"{backend}: end_node clears active"
            assert s[f"model.{model}.misses"] - before[f"model.{model}.misses"] == 1, backend
            assert s[f"model.{model}.hits"] == before[f"model.{model}.hits"], f"{backend}: invalidated each call"
    pins.end_prompt()
