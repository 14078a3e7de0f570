"""One pin for a module's tensors (cast_many_to_device, Note [Gathered pins]) and
the cast into a caller's buffer (cast_to_device(..., out=))."""
import pytest
import torch


def delta(pins, before, key):
    return pins.stats().get(key, 0) - before.get(key, 0)


def bits(t):
    return t.contiguous().view(torch.uint8)


def mixed():
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(96, 40, generator=g) * 100).to(torch.float16)
    bias = torch.randn(96, generator=g) * 100  # float32
    return weight, bias


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_results_are_bit_exact_against_separate_to(pins, model, dtype):
    weight, bias = mixed()
    strided = torch.randn(40, 96).t()  # non-contiguous
    sliced = torch.randn(8, 64)[:, ::2]  # non-contiguous, gaps in its storage
    sources = [weight, bias, strided, sliced]
    for _ in range(2):  # miss, then hit
        got = pins.cast_many_to_device(sources, "cpu", dtype=dtype, model=model)
        assert len(got) == len(sources)
        for g, s in zip(got, sources):
            want = s.to("cpu").to(dtype) if dtype is not None else s.clone()
            assert g.dtype == want.dtype and g.shape == s.shape and g.is_contiguous()
            assert torch.equal(bits(g), bits(want))


def test_the_same_group_hits_one_pin(pins, model):
    weight, bias = mixed()
    before = pins.stats()
    for _ in range(3):
        pins.cast_many_to_device([weight, bias], "cpu", dtype=torch.float16, model=model)
    assert delta(pins, before, "misses") == 1
    assert delta(pins, before, "hits") == 2, "one hit per group"
    assert delta(pins, before, "pins") == 1, "one pin for both tensors"
    # One pool block: the parts at 512-byte offsets.
    assert delta(pins, before, "pinned_bytes") == 96 * 40 * 2 + (-(96 * 40 * 2) % 512) + 96 * 4
    # Another group of the same tensors is another pin.
    pins.cast_many_to_device([bias, weight], "cpu", model=model)
    pins.cast_many_to_device([weight], "cpu", model=model)
    assert delta(pins, before, "pins") == 3


def test_results_come_from_one_transfer_and_share_no_storage(pins, model):
    weight, bias = mixed()
    w, b = pins.cast_many_to_device([weight, bias], "cpu", model=model)
    # The first result is a view of the buffer the one transfer filled: it holds
    # the bias's bytes past the weight's (512-byte aligned).
    assert w.untyped_storage().nbytes() == weight.nbytes + (-weight.nbytes % 512) + bias.nbytes
    assert w.storage_offset() == 0
    # torch's rule for custom ops (checked by torch.compile): no shared storage.
    assert w.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert torch.equal(w, weight) and torch.equal(b, bias)
    w2, b2 = pins.cast_many_to_device([weight, bias], "cpu", dtype=torch.float32, model=model)
    ptrs = {t.untyped_storage().data_ptr() for t in (w, b, w2, b2)}
    assert len(ptrs) == 4, "each cast returns its own copies"


def test_a_stale_part_makes_the_group_stale(pins, model):
    weight, bias = mixed()
    pins.cast_many_to_device([weight, bias], "cpu", model=model)
    bias.add_(1)  # through the version counter
    before = pins.stats()
    _, b = pins.cast_many_to_device([weight, bias], "cpu", model=model)
    assert torch.equal(b, bias)
    assert delta(pins, before, "misses") == 1 and delta(pins, before, "dropped") == 1
    with torch.inference_mode():
        w_inf, b_inf = torch.randn(32, 8), torch.zeros(32)
    pins.cast_many_to_device([w_inf, b_inf], "cpu", model=model)
    with torch.inference_mode():
        b_inf.fill_(2.0)  # no version counter sees it: the caller reports it (Note [Content check] might too)
    assert pins.invalidate(b_inf) == 32 * 8 * 4 + (-(32 * 8 * 4) % 512) + 32 * 4, "the whole group"
    _, b = pins.cast_many_to_device([w_inf, b_inf], "cpu", model=model)
    assert torch.equal(b, torch.full((32,), 2.0))


def test_a_part_written_in_place_makes_the_group_stale_by_its_content(pins, model):
    pins.configure(content_check=True)  # the pins fixture turns it off again after
    with torch.inference_mode():  # no version counter: Note [Content check] samples each part
        weight, bias = torch.randn(64, 32), torch.randn(64)
    pins.cast_many_to_device([weight, bias], "cpu", model=model)
    with torch.inference_mode():
        bias.mul_(2)
    before = pins.stats()
    w, b = pins.cast_many_to_device([weight, bias], "cpu", model=model)
    assert torch.equal(w, weight) and torch.equal(b, bias)
    assert delta(pins, before, "content_mismatches") == 1 and delta(pins, before, "misses") == 1
    before = pins.stats()
    pins.cast_many_to_device([weight, bias], "cpu", model=model)
    assert delta(pins, before, "hits") == 1


def test_a_signature_applies_to_the_group(pins, model):
    weight, bias = mixed()
    pins.cast_many_to_device([weight, bias], "cpu", model=model, signature=1)
    before = pins.stats()
    pins.cast_many_to_device([weight, bias], "cpu", model=model, signature=1)
    pins.cast_many_to_device([weight, bias], "cpu", model=model, signature=2)
    assert delta(pins, before, "hits") == 1 and delta(pins, before, "misses") == 1


def test_resident_and_patches_groups_go_to_their_subsets(pins, model):
    a, b = torch.randn(16), torch.randn(4)
    pins.cast_many_to_device([a, b], "cpu", model=model, resident=True)
    pins.cast_many_to_device([a, b], "cpu", model=model, kind="patches", resident=True, signature=5)
    s = pins.stats()
    assert s[f"model.{model}.weights-loaded.pins"] == 1 and s[f"model.{model}.patches-loaded.pins"] == 1


def test_plain_copies_and_empty_groups(pins, model):
    weight, bias = mixed()
    before = pins.stats()
    w, b = pins.cast_many_to_device((weight, bias), "cpu", dtype=torch.bfloat16)  # model=-1, a tuple
    assert torch.equal(w, weight.to(torch.bfloat16)) and torch.equal(b, bias.to(torch.bfloat16))
    assert delta(pins, before, "plain_copies") == 2 and delta(pins, before, "pins") == 0
    assert pins.cast_many_to_device([], "cpu", model=model) == []
    e, f = pins.cast_many_to_device([torch.empty(0), torch.empty(3, 0)], "cpu", model=model)
    assert e.shape == (0,) and f.shape == (3, 0)
    assert delta(pins, before, f"model.{model}.bypassed.empty") == 1, "a group of no bytes, once"
    x, y = pins.cast_many_to_device([torch.empty(0), bias], "cpu", model=model)
    assert x.shape == (0,) and torch.equal(y, bias)


def test_parameters_and_grad_sources_give_plain_results(pins, model):
    p = torch.nn.Parameter(torch.randn(8, 4))
    q = torch.nn.Parameter(torch.randn(8))
    w, b = pins.cast_many_to_device([p, q], "cpu", model=model)
    assert not w.requires_grad and not b.requires_grad and w.grad_fn is None
    assert torch.equal(w, p.detach()) and torch.equal(b, q.detach())


# --- cast_to_device(..., out=) --------------------------------------------------------

@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
def test_out_is_bit_exact_and_hits(pins, model, dtype):
    src = torch.randn(64, 48) * 100
    want = src.to(dtype) if dtype is not None else src
    before = pins.stats()
    for _ in range(2):
        buf = torch.empty(64, 48, dtype=dtype or src.dtype)
        assert pins.cast_to_device(src, "cpu", dtype=dtype, model=model, out=buf) is buf
        assert torch.equal(bits(buf), bits(want))
    assert delta(pins, before, "misses") == 1 and delta(pins, before, "hits") == 1


def test_out_takes_a_non_contiguous_buffer_and_source(pins, model):
    src = torch.randn(32, 16).t()
    buf = torch.empty(32, 16).t()  # the source's shape, transposed strides
    pins.cast_to_device(src, "cpu", model=model, out=buf)
    assert torch.equal(buf, src)
    plain = torch.empty(16, 32)
    pins.cast_to_device(src, "cpu", out=plain)  # model=-1: a plain copy into it
    assert torch.equal(plain, src)


def test_out_from_an_inference_weight_inside_inference_mode(pins, model):
    with torch.inference_mode():
        w = torch.randn(128)
        buf = torch.empty(128, dtype=torch.float16)
        for _ in range(2):
            pins.cast_to_device(w, "cpu", dtype=torch.float16, model=model, out=buf)
    assert torch.equal(buf, w.half())
    assert pins.stats()[f"model.{model}.hits"] == 1


def test_out_with_a_wrong_buffer_writes_nothing(pins, model):
    src = torch.randn(8)
    buf = torch.zeros(9)
    with pytest.raises(ValueError, match=r"out must have the source's shape \[8\], got out of shape \[9\]"):
        pins.cast_to_device(src, "cpu", model=model, out=buf)
    assert buf.sum() == 0
    with pytest.raises(ValueError, match=r"out must have dtype Half \(the dtype argument\), got out of dtype Float"):
        pins.cast_to_device(src, "cpu", dtype=torch.float16, model=model, out=torch.zeros(8))
    with pytest.raises(ValueError, match=r"out must be on the device cpu, got out on meta"):
        pins.cast_to_device(src, "cpu", model=model, out=torch.empty(8, device="meta"))
    assert pins.stats()[f"model.{model}.misses"] == 0, "checked before any pin"
