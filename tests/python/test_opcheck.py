"""torch.library.opcheck on every op, and torch.compile of a function that casts."""
import pytest
import torch

# Every op of the pins namespace has an opcheck below.
CHECKED = {"cast_to_device", "cast_many_to_device", "register_model", "forget_model", "set_active", "mark_prompt",
           "set_device_bytes",
           "end_prompt", "end_node", "invalidate", "invalidate_model", "load_file", "free_pins", "stats", "summary",
           "locked_bytes", "configure", "config", "config_sources"}
# Overloads besides "default": cast_to_device's out= variant.
OVERLOADS = {"cast_to_device": ["default", "out"]}
# torch.compile functionalizes a custom out= op from the release that tags it
# Tag.out (2.13); before it (2.11) functionalization refuses any custom op whose
# output aliases an input, so there the out= overload runs eagerly only
# (docs/RELEASES.md).
COMPILES_OUT = hasattr(torch.Tag, "out")


def test_every_op_is_checked(pins):
    ops = {name.split("::", 1)[1].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
           if name.startswith("pins::")}
    assert ops == CHECKED, "an op was added or removed: give it an opcheck here and a dispatcher test in tests/ops"
    for name in ops:
        assert sorted(getattr(torch.ops.pins, name).overloads()) == OVERLOADS.get(name, ["default"]), name
    # Tag.out where this torch has it, out_variant in releases before (ops/cast_to_device.cpp).
    tag = getattr(torch.Tag, "out", None) or torch.Tag.out_variant
    assert tag in torch.ops.pins.cast_to_device.out.tags, "torch.compile functionalizes it as an out variant"
    # Any strides in (Note [Casts under inductor] in ops/cast_to_device.cpp).
    for op in (torch.ops.pins.cast_to_device.default, torch.ops.pins.cast_many_to_device.default):
        assert torch.Tag.flexible_layout in op.tags, op


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


def test_opcheck_cast_to_device_out(pins, model):
    w = torch.randn(8, 8)
    for dtype, kwargs in ((None, {}), (torch.float16, {"model": model}),
                          (None, {"model": model, "resident": True, "signature": 9})):
        out = torch.empty(8, 8, dtype=dtype or w.dtype)
        args = (w, torch.device("cpu"), dtype, False, kwargs.get("model", -1), "weights",
                kwargs.get("resident", False), kwargs.get("signature"))
        # Not test_schema: torch's SchemaCheckMode cannot inspect a Device argument
        # once an output aliases an input (any out= op with a Device fails it:
        # "Cannot inspect value of type Device"). What it would check is checked here.
        torch.library.opcheck(torch.ops.pins.cast_to_device.out, args, {"out": out},
                              test_utils=("test_autograd_registration", "test_faketensor")
                              + (("test_aot_dispatch_dynamic",) if COMPILES_OUT else ()))
        version = out._version
        assert torch.ops.pins.cast_to_device.out(*args, out=out) is out, "returns out itself"
        assert torch.equal(out, w.to(dtype or w.dtype))
        assert out._version > version, "writing out bumps its version counter"
        assert torch.equal(w, args[0]) and w._version == 0, "the source is not written"


def test_opcheck_cast_many_to_device(pins, model):
    w, b = torch.randn(8, 4, dtype=torch.float16), torch.randn(8)
    torch.library.opcheck(torch.ops.pins.cast_many_to_device.default,
                          ([torch.randn(4, 4, requires_grad=True), b], torch.device("cpu"), None, False, model,
                           "weights", False, None))
    for kwargs in ({}, {"dtype": torch.bfloat16}, {"model": model}, {"model": model, "dtype": torch.float32},
                   {"model": model, "kind": "patches", "resident": True, "signature": 3}):
        args = ([w, b.t() if b.dim() > 1 else b], torch.device("cpu"), kwargs.get("dtype"), False,
                kwargs.get("model", -1), kwargs.get("kind", "weights"), kwargs.get("resident", False),
                kwargs.get("signature"))
        torch.library.opcheck(torch.ops.pins.cast_many_to_device.default, args)


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_torch_compile_fullgraph_traces_the_gathered_and_out_casts(pins, model, backend, fresh_compile):
    w, b = torch.randn(16, 8), torch.randn(16)

    def f(x, buf):
        cw, cb = torch.ops.pins.cast_many_to_device([w, b], torch.device("cpu"), torch.float16, False, model,
                                                    "weights", False, None)
        if COMPILES_OUT:
            torch.ops.pins.cast_to_device.out(b, torch.device("cpu"), None, False, model, "weights", False, None,
                                              out=buf)
        else:  # the same bytes into the caller's buffer, through the default overload
            buf.copy_(torch.ops.pins.cast_to_device(b, torch.device("cpu"), None, False, model, "weights", False, None))
        return x.half() @ cw.t() + cb, buf * 2

    def plain(x, buf):  # the same with .to(): what the backend makes of it without pins
        buf.copy_(b)
        return x.half() @ w.half().t() + b.half(), buf * 2

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    x = torch.randn(3, 8)
    want, _ = torch.compile(plain, fullgraph=True, backend=backend)(x, torch.empty(16))
    for _ in range(2):
        buf = torch.empty(16)
        y, z = compiled(x, buf)
        assert torch.equal(y, want)
        assert torch.equal(z, b * 2) and torch.equal(buf, b), "the out= write reaches the caller's buffer"


def test_opcheck_invalidate(pins, model):
    w = torch.randn(8)
    pins.cast_to_device(w, "cpu", model=model)
    # Returns the bytes it dropped: eager and traced runs see different pins.
    torch.library.opcheck(torch.ops.pins.invalidate.default, (w,),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("name,args", [
    ("register_model", ("opcheck", torch.device("cpu"))),
    ("register_model", ("opcheck-fast", torch.device("cpu"), True)),
    ("register_model", ("opcheck-sized", torch.device("cpu"), False, 1 << 20)),
    ("set_active", None),
    ("set_device_bytes", None),
    ("mark_prompt", None),
    ("end_prompt", ()),
    ("end_node", ()),
    ("invalidate_model", None),
    ("free_pins", (0, False)),
    ("stats", ()),
    ("summary", ()),
    ("locked_bytes", ()),
    ("configure", ("fast_disk:false",)),
    ("config", ()),
    ("config_sources", ()),
])
def test_opcheck_control_ops(pins, model, name, args):
    if args is None:
        args = {"set_active": (model, False), "set_device_bytes": (model, 1 << 20, 4 << 20), "mark_prompt": ([model],),
                "invalidate_model": (model,)}[name]
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if name in ("register_model", "stats", "summary", "locked_bytes", "config", "config_sources"):
        # Each call returns a new id / the counters of that moment, so eager and
        # traced runs cannot agree (and config's string, like summary's, is no
        # tensor the traced run can compare); the other checks still apply.
        utils = utils[:3]
    torch.library.opcheck(getattr(torch.ops.pins, name).default, args, test_utils=utils)
    pins.end_prompt()


def test_opcheck_load_file(pins, tmp_path):
    import safetensors.torch
    path = str(tmp_path / "w.safetensors")
    safetensors.torch.save_file({"w": torch.randn(4, 3)}, path)
    # Each call maps the file anew (new storages); the schema and autograd checks apply.
    torch.library.opcheck(torch.ops.pins.load_file.default, (path,),
                          test_utils=("test_schema", "test_autograd_registration"))


def test_opcheck_forget_model(pins):
    m = pins.register_model("to-forget", "cpu")
    # forget_model cannot run twice on one id, so only the schema checks apply.
    torch.library.opcheck(torch.ops.pins.forget_model.default, (m,), test_utils=("test_schema",))


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_torch_compile_fullgraph_traces_cast(pins, model, backend, fresh_compile):
    w = torch.randn(32, 16)

    def f(x):
        y = torch.ops.pins.cast_to_device(x, torch.device("cpu"), torch.float16, False, model, "weights", True, None)
        return y * 2

    compiled = torch.compile(f, fullgraph=True, backend=backend)
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
