"""Wrapper tensor subclasses through pins (Note [Wrapper subclasses] in
torch_pins/_subclass.py): flattened, their plain inner tensors pinned and cast
as they are, put back together as the same class; refused with a ValueError
naming the type when the class hides its data. test_comfy.py does the same with
ComfyUI's QuantizedTensor where the checkout has it."""
import pytest
import torch

from torch_pins import _subclass

aten = torch.ops.aten


class ScaledInt8(torch.Tensor):
    """A small quantized wrapper: int8 payload and a float32 scale; its dtype is
    the dtype it dequantizes to."""

    @staticmethod
    def __new__(cls, qdata, scale, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=dtype, device=qdata.device)

    def __init__(self, qdata, scale, dtype):
        self._qdata, self._scale = qdata, scale

    def __repr__(self):
        return f"ScaledInt8({self.dtype}, {tuple(self.shape)}, {self.device})"

    def __tensor_flatten__(self):
        return ["_qdata", "_scale"], {"dtype": self.dtype}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return ScaledInt8(inner["_qdata"], inner["_scale"], ctx["dtype"])

    @classmethod
    def quantize(cls, x):
        scale = x.abs().amax().float() / 127
        return cls(torch.round(x / scale).to(torch.int8), scale, x.dtype)

    def dequantize(self):
        return self._qdata.to(self.dtype) * self._scale.to(self.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.detach.default:
            return cls(args[0]._qdata, args[0]._scale, args[0].dtype)
        if func is aten._to_copy.default and set(kwargs) <= {"dtype"}:
            return cls(args[0]._qdata, args[0]._scale, kwargs.get("dtype", args[0].dtype))  # payload kept
        unwrapped = [a.dequantize() if isinstance(a, cls) else a for a in args]
        return func(*unwrapped, **kwargs)


class Nested(torch.Tensor):
    """A wrapper around another wrapper and a plain offset."""

    @staticmethod
    def __new__(cls, inner, offset):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner, offset):
        self._inner, self._offset = inner, offset

    def __tensor_flatten__(self):
        return ["_inner", "_offset"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Nested(inner["_inner"], inner["_offset"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.detach.default:
            return cls(args[0]._inner, args[0]._offset)
        raise NotImplementedError(func)


class Opaque(torch.Tensor):
    """A wrapper subclass without the flatten protocol: pins cannot see its data."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data):
        self._data = data

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        return func(*[a._data if isinstance(a, cls) else a for a in args], **kwargs)


def _quantized(shape=(64, 32), seed=0, inference=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if inference:
        with torch.inference_mode():
            return ScaledInt8.quantize(x.clone())
    return ScaledInt8.quantize(x)


def delta(pins, before, key):
    return pins.stats().get(key, 0) - before.get(key, 0)


def test_which_tensors_are_wrappers():
    assert _subclass.is_wrapper(_quantized())
    assert _subclass.is_wrapper(Opaque(torch.zeros(2)))
    assert not _subclass.is_wrapper(torch.zeros(2))
    assert not _subclass.is_wrapper(torch.nn.Parameter(torch.zeros(2)))

    class Tagged(torch.Tensor):  # a subclass without its own dispatch has real storage
        pass

    assert not _subclass.is_wrapper(torch.zeros(2).as_subclass(Tagged))
    assert not _subclass.is_wrapper("not a tensor")


def test_a_wrapper_is_cast_as_itself_with_its_payload_untouched(pins, model):
    q = _quantized()
    out = pins.cast_to_device(q, "cpu", model=model)
    assert type(out) is ScaledInt8 and out.dtype == torch.float32 and out.shape == q.shape
    assert out._qdata.dtype == torch.int8 and torch.equal(out._qdata, q._qdata)
    assert out._qdata.data_ptr() != q._qdata.data_ptr(), "a copy, not the source"
    assert torch.equal(out._scale, q._scale)
    assert torch.equal(out.dequantize(), q.dequantize())


def test_repeated_casts_hit_one_gathered_pin(pins, model):
    q = _quantized()
    before = pins.stats()
    for _ in range(4):
        out = pins.cast_to_device(q, "cpu", model=model)
        assert torch.equal(out.dequantize(), q.dequantize())
    assert delta(pins, before, "misses") == 1, "payload and scale share one pin"
    assert delta(pins, before, "hits") == 3


def test_wrappers_made_in_inference_mode_hit_too(pins, model):
    q = _quantized(inference=True)
    assert q._qdata.is_inference()
    before = pins.stats()
    for _ in range(3):
        with torch.inference_mode():
            out = pins.cast_to_device(q, "cpu", model=model)
        assert torch.equal(out._qdata, q._qdata)
    assert delta(pins, before, "misses") == 1 and delta(pins, before, "hits") == 2


def test_dtype_applies_to_the_wrapper_after_it_is_rebuilt(pins, model):
    q = _quantized()
    out = pins.cast_to_device(q, "cpu", dtype=torch.bfloat16, model=model)
    assert type(out) is ScaledInt8 and out.dtype == torch.bfloat16
    assert out._qdata.dtype == torch.int8 and out._scale.dtype == torch.float32, "payloads are not converted"
    assert torch.equal(out._qdata, q._qdata)


def test_nested_wrappers_are_flattened_all_the_way(pins, model):
    n = Nested(_quantized(), torch.tensor(0.5))
    before = pins.stats()
    for _ in range(2):
        out = pins.cast_to_device(n, "cpu", model=model)
        assert type(out) is Nested and type(out._inner) is ScaledInt8
        assert torch.equal(out._inner._qdata, n._inner._qdata) and torch.equal(out._offset, n._offset)
    assert delta(pins, before, "misses") == 1 and delta(pins, before, "hits") == 1
    leaves = _subclass.inner_tensors(n)
    assert len(leaves) == 3 and all(a is b for a, b in zip(leaves, [n._inner._qdata, n._inner._scale, n._offset]))


def test_a_subclass_without_the_flatten_protocol_is_refused_by_name(pins, model):
    o = Opaque(torch.randn(8))
    with pytest.raises(ValueError, match="Opaque.*__tensor_flatten__"):
        pins.cast_to_device(o, "cpu", model=model)
    with pytest.raises(ValueError, match=r"sources\[1\].*Opaque"):
        _subclass.cast_many_to_device([torch.randn(3), o], "cpu", model=model)
    with pytest.raises(ValueError, match="Opaque"):
        _subclass.inner_tensors(o)


def test_cast_many_mixes_plain_tensors_and_wrappers(pins, model):
    plain, q = torch.randn(16), _quantized()
    before = pins.stats()
    a, b = _subclass.cast_many_to_device([plain, q], "cpu", dtype=torch.float16, model=model)
    assert a.dtype == torch.float16 and torch.equal(a, plain.half())
    assert type(b) is ScaledInt8 and b.dtype == torch.float16 and b._qdata.dtype == torch.int8
    a2, b2 = _subclass.cast_many_to_device([plain, q], "cpu", model=model)
    assert torch.equal(a2, plain) and torch.equal(b2._qdata, q._qdata) and b2.dtype == torch.float32
    assert delta(pins, before, "misses") == 1, "one group, one pin, whatever the dtype"
    assert delta(pins, before, "hits") == 1
    c, d = pins.cast_many_to_device([plain, q], "cpu", dtype=torch.float16, model=model)  # the public form
    assert torch.equal(c, a) and torch.equal(d._qdata, q._qdata) and d.dtype == torch.float16
    assert delta(pins, before, "hits") == 2


def test_out_casts_into_a_wrapper_of_the_same_layout(pins, model):
    q = _quantized()
    out = ScaledInt8(torch.empty_like(q._qdata), torch.empty_like(q._scale), q.dtype)
    result = pins.cast_to_device(q, "cpu", model=model, out=out)
    assert result is out
    assert torch.equal(out._qdata, q._qdata) and torch.equal(out._scale, q._scale)
    with pytest.raises(ValueError, match="out must be"):
        pins.cast_to_device(q, "cpu", model=model, out=torch.empty(q.shape))
    with pytest.raises(ValueError, match="dtype"):
        pins.cast_to_device(q, "cpu", dtype=torch.float16, model=model, out=out)


def test_a_parameter_holding_a_wrapper_is_cast_as_the_wrapper(pins, model):
    p = torch.nn.Parameter(_quantized(), requires_grad=False)
    out = pins.cast_to_device(p, "cpu", model=model)
    assert type(out) is ScaledInt8 and torch.equal(out._qdata, p._qdata)


def test_without_a_model_it_is_a_plain_copy(pins):
    q = _quantized()
    before = pins.stats()
    out = pins.cast_to_device(q, "cpu")
    assert torch.equal(out.dequantize(), q.dequantize())
    assert delta(pins, before, "pins") == 0


def test_comfy_kitchens_quantized_tensor_is_cast_as_itself(pins, model):
    # comfy_kitchen holds the QuantizedTensor that current ComfyUI re-exports
    # from comfy.quant_ops (the checkout test_comfy.py runs may predate it).
    tensor_mod = pytest.importorskip("comfy_kitchen.tensor", reason="comfy-kitchen is not installed")
    QuantizedTensor = tensor_mod.QuantizedTensor
    with torch.inference_mode():  # as ComfyUI loads weights
        weight = torch.randn(64, 32, dtype=torch.bfloat16)
        q = QuantizedTensor.from_float(weight, "TensorCoreFP8Layout")
    before = pins.stats()
    out = [pins.cast_to_device(q, "cpu", model=model) for _ in range(3)]
    half = pins.cast_to_device(q, "cpu", dtype=torch.float16, model=model)
    after = pins.stats()
    assert all(type(o) is QuantizedTensor and o.dtype == torch.bfloat16 for o in out)
    assert all(torch.equal(o.dequantize(), q.dequantize()) for o in out)
    assert type(half) is QuantizedTensor and half.dtype == torch.float16
    # One pin holds the payload and its scale; never a new full-width pin per call.
    assert after["misses"] - before["misses"] == 1 and after["hits"] - before["hits"] == 3
    assert after["pins"] - before["pins"] == 1
    assert after["pinned_bytes"] - before["pinned_bytes"] < weight.numel() * weight.element_size()


# --- plain Python subclasses with instance attributes (issue 35, item 3) ---

class Tagged(torch.Tensor):
    """A plain subclass: real storage, torch's own dispatch, attributes set on
    the instance (its __dict__)."""


class GGMLLike(torch.Tensor):
    """Shaped like ComfyUI-GGUF's GGMLTensor (our own, from its interface): raw
    quantized bytes with the logical type and shape as attributes, a ``.to``
    that carries them over (and copies the patch list), a ``shape`` that
    answers the logical shape."""

    def __new__(cls, *args, tensor_type, tensor_shape, patches=None, **kwargs):
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, tensor_type, tensor_shape, patches=None, **kwargs):
        super().__init__()
        self.tensor_type, self.tensor_shape, self.patches = tensor_type, tensor_shape, list(patches or [])

    def detach(self, *args, **kwargs):  # as GGMLTensor's: Parameter(g) is g itself, marked
        return self

    def to(self, *args, **kwargs):
        new = super().to(*args, **kwargs)
        new.tensor_type = getattr(self, "tensor_type", None)
        new.tensor_shape = getattr(self, "tensor_shape", new.data.shape)
        new.patches = getattr(self, "patches", []).copy()
        return new

    @property
    def shape(self):
        if not hasattr(self, "tensor_shape"):
            self.tensor_shape = self.size()
        return self.tensor_shape


def _ggml(rows=8, cols=32):
    raw = torch.randint(0, 255, (rows, cols + 2), dtype=torch.uint8)  # Q8_0-like rows: a scale and the bytes
    return GGMLLike(raw, tensor_type="Q8_0", tensor_shape=torch.Size([rows, cols]), patches=[("lora", 1.0)])


def test_which_plain_subclasses_carry_state():
    t = torch.randn(4).as_subclass(Tagged)
    assert not _subclass.is_wrapper(t) and not _subclass.is_wrapper(_ggml())


def test_a_plain_subclass_keeps_its_class_and_attributes(pins, model):
    t = torch.randn(4, 4).as_subclass(Tagged)
    t.note, t.scale = "fp32 master", 0.5
    for _ in range(2):
        out = pins.cast_to_device(t, "cpu", torch.float16, model=model)
        assert type(out) is Tagged and (out.note, out.scale) == ("fp32 master", 0.5), vars(out)
        assert torch.equal(out.as_subclass(torch.Tensor), t.as_subclass(torch.Tensor).half())
    assert pins.stats()[f"model.{model}.hits"] == 1, "its pin serves the second cast"


def test_a_subclass_with_its_own_to_gets_what_its_to_gives(pins, model):
    # ComfyUI-GGUF dequantizes with tensor_type and tensor_shape: without them
    # a Q8_0 [8, 32] weight read back as the [8, 34] raw bytes.
    g = _ggml()
    want = g.to("cpu", copy=True)
    for _ in range(2):
        out = pins.cast_to_device(g, "cpu", model=model)
        assert type(out) is GGMLLike and out.tensor_type == want.tensor_type == "Q8_0"
        assert out.shape == want.shape == torch.Size([8, 32]) and out.size() == g.size()
        assert out.patches == g.patches and out.patches is not g.patches, "its .to copies the patch list"
        assert torch.equal(out.as_subclass(torch.Tensor), g.as_subclass(torch.Tensor))
    assert pins.stats()[f"model.{model}.hits"] == 1


def test_cast_many_gives_each_source_its_own_class(pins, model):
    g, bias = _ggml(), torch.randn(8)
    for _ in range(2):
        w, b = pins.cast_many_to_device([g, bias], "cpu", model=model)
        assert type(w) is GGMLLike and w.tensor_type == "Q8_0" and w.shape == torch.Size([8, 32])
        assert type(b) is torch.Tensor, "a plain source gives a plain tensor, as its .to() does"
        assert torch.equal(b, bias)
    assert pins.stats()[f"model.{model}.hits"] == 1, "one gathered pin for both"


def test_a_plain_subclass_beside_a_wrapper_keeps_its_attributes(pins, model):
    g, q = _ggml(), ScaledInt8.quantize(torch.randn(8, 8))
    w, s = pins.cast_many_to_device([g, q], "cpu", model=model)
    assert type(w) is GGMLLike and w.tensor_type == "Q8_0" and type(s) is ScaledInt8


def test_a_parameter_of_a_plain_subclass_is_cast_as_the_subclass(pins, model):
    # torch.nn.Parameter(GGMLTensor) is the GGMLTensor itself, marked as a
    # parameter; its .to() result is no parameter, and neither is pins'.
    p = torch.nn.Parameter(_ggml(), requires_grad=False)
    out = pins.cast_to_device(p, "cpu", model=model)
    assert type(out) is GGMLLike and out.tensor_type == "Q8_0"
    assert not isinstance(out, torch.nn.Parameter) and not isinstance(p.to("cpu", copy=True), torch.nn.Parameter)


def test_a_subclass_with_its_own_torch_function_sees_the_cast_and_keeps_its_attributes(pins, model):
    seen = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    t = torch.randn(4).as_subclass(Watched)
    t.note = "kept"
    w, b = pins.cast_many_to_device([t, torch.randn(4)], "cpu", torch.float16, model=model)
    out = pins.cast_to_device(t, "cpu", torch.float16, model=model)
    names = {getattr(f, "_qualified_op_name", None) or getattr(f, "_name", None) for f in seen}
    assert {"pins::cast_to_device", "pins::cast_many_to_device"} <= names, seen
    assert type(out) is Watched and out.note == "kept" and type(w) is Watched and w.note == "kept"
