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
