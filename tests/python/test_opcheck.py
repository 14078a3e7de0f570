"""torch.library.opcheck on every op, and torch.compile of a function that casts."""
import pytest
import torch

# Every op of the pins namespace has an opcheck below.
CHECKED = {"cast_to_device", "register_model", "forget_model", "set_active", "mark_prompt", "end_prompt",
           "free_pins", "stats", "configure"}


def test_every_op_is_checked(pins):
    ops = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names() if name.startswith("pins::")}
    assert ops == CHECKED, "an op was added or removed: give it an opcheck here and a dispatcher test in tests/ops"
    for name in ops:
        assert getattr(torch.ops.pins, name).overloads() == ["default"], name


def test_opcheck_cast_to_device(pins, model):
    w = torch.randn(8, 8)
    # A source that requires grad exercises the autograd registration check.
    torch.library.opcheck(torch.ops.pins.cast_to_device.default,
                          (torch.randn(4, 4, requires_grad=True), torch.device("cpu"), None, False, model,
                           "weights", False, None))
    for kwargs in ({}, {"dtype": torch.float16}, {"model": model}, {"model": model, "resident": True},
                   {"model": model, "kind": "patches", "resident": True, "signature": 3}):
        args = (w, torch.device("cpu"), kwargs.get("dtype"), False, kwargs.get("model", -1),
                kwargs.get("kind", "weights"), kwargs.get("resident", False), kwargs.get("signature"))
        torch.library.opcheck(torch.ops.pins.cast_to_device.default, args)


@pytest.mark.parametrize("name,args", [
    ("register_model", ("opcheck", torch.device("cpu"))),
    ("set_active", None),
    ("mark_prompt", None),
    ("end_prompt", ()),
    ("free_pins", (0, False)),
    ("stats", ()),
    ("configure", ("fast_disk:false",)),
])
def test_opcheck_control_ops(pins, model, name, args):
    if args is None:
        args = {"set_active": (model, False), "mark_prompt": ([model],)}[name]
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if name in ("register_model", "stats"):
        # Each call returns a new id / the counters of that moment, so eager and
        # traced runs cannot agree; the other checks still apply.
        utils = utils[:3]
    torch.library.opcheck(getattr(torch.ops.pins, name).default, args, test_utils=utils)
    pins.end_prompt()


def test_opcheck_forget_model(pins):
    m = pins.register_model("to-forget", "cpu")
    # forget_model cannot run twice on one id, so only the schema checks apply.
    torch.library.opcheck(torch.ops.pins.forget_model.default, (m,), test_utils=("test_schema",))


def test_torch_compile_fullgraph_traces_cast(pins, model):
    w = torch.randn(32, 16)

    def f(x):
        y = torch.ops.pins.cast_to_device(x, torch.device("cpu"), torch.float16, False, model, "weights", True, None)
        return y * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    before = pins.stats()["hits"]
    out = compiled(w)
    assert torch.equal(out, (w.to(torch.float16) * 2))
    out = compiled(w)
    assert pins.stats()["hits"] >= before + 1, "the compiled graph runs the real op"


def test_fake_kernel_reports_the_target_device_and_dtype(pins):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 5)
        y = torch.ops.pins.cast_to_device(x, torch.device("meta"), torch.bfloat16)
    assert y.shape == (4, 5) and y.dtype == torch.bfloat16 and y.device.type == "meta"


def test_fake_kernel_refuses_what_the_real_kernel_refuses(pins):
    # The same error type while tracing as in eager mode (Note [Error types]).
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, device="meta")
        with pytest.raises(ValueError, match="source must be a CPU tensor, got device meta"):
            torch.ops.pins.cast_to_device(x, torch.device("cpu"))
    with pytest.raises(ValueError, match="source must be a CPU tensor, got device meta"):
        torch.ops.pins.cast_to_device(torch.empty(4, device="meta"), torch.device("cpu"))
