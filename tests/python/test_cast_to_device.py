"""The cast path (DESIGN.md "Choosing and creating a pin") through the torch op."""
import gc

import pytest
import torch


def delta(pins, before, key):
    return pins.stats().get(key, 0) - before.get(key, 0)


def subset_pins(pins, model, subset):
    return pins.stats()[f"model.{model}.{subset}.pins"]


def test_plain_copy_without_model_pins_nothing(pins):
    w = torch.randn(32, 32)
    before = pins.stats()
    out = pins.cast_to_device(w, "cpu")
    assert torch.equal(out, w)
    assert out.data_ptr() != w.data_ptr()
    assert delta(pins, before, "pins") == 0
    assert delta(pins, before, "misses") == 0


def test_second_cast_hits_the_pin(pins, model):
    w = torch.randn(256, 64)
    before = pins.stats()
    a = pins.cast_to_device(w, "cpu", model=model)
    b = pins.cast_to_device(w, "cpu", model=model)
    assert torch.equal(a, w) and torch.equal(b, w)
    assert a.data_ptr() != b.data_ptr(), "each cast returns its own copy"
    assert delta(pins, before, "misses") == 1
    assert delta(pins, before, "hits") == 1
    assert delta(pins, before, "hit_bytes") == w.numel() * 4
    assert subset_pins(pins, model, "weights") == 1


def test_creation_subsets(pins, model):
    streamed, resident = torch.randn(100), torch.randn(100)
    patch, patch_sig = torch.randn(10), torch.randn(10)
    pins.cast_to_device(streamed, "cpu", model=model)
    pins.cast_to_device(resident, "cpu", model=model, resident=True)
    pins.cast_to_device(patch, "cpu", model=model, kind="patches", resident=True)  # no signature
    pins.cast_to_device(patch_sig, "cpu", model=model, kind="patches", resident=True, signature=7)
    assert subset_pins(pins, model, "weights") == 1
    assert subset_pins(pins, model, "weights-loaded") == 1
    assert subset_pins(pins, model, "patches") == 1
    assert subset_pins(pins, model, "patches-loaded") == 1


def test_fast_disk_creates_streaming_pins_but_reuses_loaded_ones(pins, model):
    old_w, old_p = torch.randn(64), torch.randn(64)
    pins.cast_to_device(old_w, "cpu", model=model, resident=True)
    pins.cast_to_device(old_p, "cpu", model=model, kind="patches", resident=True, signature=1)
    pins.configure(fast_disk=True)
    new_w = torch.randn(64)
    pins.cast_to_device(new_w, "cpu", model=model, resident=True)
    assert subset_pins(pins, model, "weights") == 1
    assert subset_pins(pins, model, "weights-loaded") == 1
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(old_w, "cpu", model=model, resident=True), old_w)
    assert torch.equal(pins.cast_to_device(old_p, "cpu", model=model, kind="patches", resident=True, signature=1), old_p)
    assert delta(pins, before, f"model.{model}.weights-loaded.hits") == 1
    assert delta(pins, before, f"model.{model}.patches-loaded.hits") == 1


def test_streaming_lookup_comes_first(pins, model):
    w = torch.randn(64)
    pins.cast_to_device(w, "cpu", model=model)
    before = pins.stats()
    pins.cast_to_device(w, "cpu", model=model, resident=True)  # now resident: same pin
    assert delta(pins, before, f"model.{model}.weights.hits") == 1
    assert subset_pins(pins, model, "weights-loaded") == 0


def test_patch_signature_change_refills(pins, model):
    p = torch.randn(128)
    pins.cast_to_device(p, "cpu", model=model, kind="patches", resident=True, signature=1)
    before = pins.stats()
    out = pins.cast_to_device(p, "cpu", model=model, kind="patches", resident=True, signature=2)
    assert torch.equal(out, p)
    assert delta(pins, before, f"model.{model}.patches-loaded.misses") == 1
    assert delta(pins, before, "dropped") == 1
    before = pins.stats()
    pins.cast_to_device(p, "cpu", model=model, kind="patches", resident=True, signature=2)
    assert delta(pins, before, f"model.{model}.patches-loaded.hits") == 1


def test_prompt_boundary_drops_patches(pins, model):
    p, pl = torch.randn(16), torch.randn(16)
    with pins.prompt([model]):
        pins.cast_to_device(p, "cpu", model=model, kind="patches")
        pins.cast_to_device(pl, "cpu", model=model, kind="patches", resident=True, signature=3)
        assert pins.stats()[f"model.{model}.in_prompt"] == 1
        assert subset_pins(pins, model, "patches") == 1
    assert pins.stats()[f"model.{model}.in_prompt"] == 0
    assert subset_pins(pins, model, "patches") == 0
    assert subset_pins(pins, model, "patches-loaded") == 1


def test_budget_refusal_copies_from_the_source(pins, model):
    pins.configure(headroom="1T")  # no pin can leave 512 GiB available
    w = torch.randn(1000)
    before = pins.stats()
    out = pins.cast_to_device(w, "cpu", dtype=torch.float16, model=model)
    assert torch.equal(out, w.to(torch.float16))
    assert delta(pins, before, "refusals") == 1
    assert delta(pins, before, "pins") == 0


def test_in_place_write_is_never_served_stale(pins, model):
    w = torch.zeros(4096)
    assert pins.cast_to_device(w, "cpu", model=model).sum() == 0
    w.add_(1)  # bumps the version counter
    before = pins.stats()
    out = pins.cast_to_device(w, "cpu", model=model)
    assert torch.equal(out, w), "a pin served stale bytes"
    assert delta(pins, before, "misses") == 1
    assert delta(pins, before, "dropped") == 1
    # A write through a view shares the version counter too.
    w[:10].mul_(3)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)


def test_pin_dies_with_its_storage(pins, model):
    w = torch.randn(1 << 16)
    pins.cast_to_device(w, "cpu", model=model)
    assert subset_pins(pins, model, "weights") == 1
    del w
    gc.collect()
    pins.end_prompt()  # the boundary sweeps pins of dead sources
    assert subset_pins(pins, model, "weights") == 0


def test_views_of_one_storage_are_separate_sources(pins, model):
    base = torch.arange(1000, dtype=torch.float32)
    a, b = base[:500], base[500:]
    assert torch.equal(pins.cast_to_device(a, "cpu", model=model), a)
    assert torch.equal(pins.cast_to_device(b, "cpu", model=model), b)
    assert subset_pins(pins, model, "weights") == 2


def test_non_contiguous_source_is_pinned_as_a_contiguous_copy(pins, model):
    base = torch.randn(64, 48)
    t = base.t()
    out = pins.cast_to_device(t, "cpu", model=model)
    assert torch.equal(out, t) and out.is_contiguous()
    # Same bytes, another layout: its own pin, right values.
    out2 = pins.cast_to_device(base, "cpu", model=model)
    assert torch.equal(out2, base)
    assert subset_pins(pins, model, "weights") == 2
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(t, "cpu", model=model), t)
    assert delta(pins, before, "hits") == 1


@pytest.mark.parametrize("src,dst", [
    (torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.float16, torch.float32),
    (torch.bfloat16, torch.float16), (torch.float32, torch.int32), (torch.int64, torch.float32),
    (torch.float32, torch.float8_e4m3fn),
])
def test_dtype_conversion_is_bit_identical_to_torch(pins, model, src, dst):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(4097, generator=g) * 1000).to(src)
    want = w.to(dst)
    for _ in range(2):  # miss, then hit
        got = pins.cast_to_device(w, "cpu", dtype=dst, model=model)
        assert got.dtype == dst
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


# A miss of a layer-sized source to the CPU (Note [Chunked fill]: whole, not in
# chunks, there) and the hit after it hold exactly the bytes of torch's copy,
# converted or not, into out= too; an odd size leaves no element out.
@pytest.mark.parametrize("src,dst", [
    (torch.float16, torch.bfloat16), (torch.float16, None), (torch.float32, torch.float16),
    (torch.int8, torch.float32), (torch.float64, torch.float32),
])
def test_a_large_miss_and_hit_have_the_bytes_of_torchs_copy(pins, model, src, dst):
    g = torch.Generator().manual_seed(1)
    n = 3 * (1 << 18) + 4099
    w = (torch.randn(n, generator=g) * 100).to(src).reshape(-1, 1)
    want = w.to(dst) if dst is not None else w.clone()
    before = pins.stats()
    for _ in range(2):  # the miss, then the hit from the pin it filled
        got = pins.cast_to_device(w, "cpu", dtype=dst, model=model)
        assert got.dtype == want.dtype and got.shape == w.shape and got.is_contiguous()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert delta(pins, before, "misses") == 1 and delta(pins, before, "hits") == 1
    w2 = w + 1
    out = torch.empty(w2.shape, dtype=want.dtype)
    for _ in range(2):
        out.zero_()
        assert pins.cast_to_device(w2, "cpu", dtype=dst, model=model, out=out) is out
        assert torch.equal(out.view(torch.uint8), w2.to(want.dtype).view(torch.uint8))


def test_free_pins_returns_bytes_freed(pins, model):
    ws = [torch.randn(1 << 14) for _ in range(4)]
    for w in ws:
        pins.cast_to_device(w, "cpu", model=model)
    assert pins.free_pins(0) == 0
    freed = pins.free_pins(2 * (1 << 14) * 4)
    assert freed == 2 * (1 << 14) * 4
    assert subset_pins(pins, model, "weights") == 2


def test_free_pins_loaded_spares_the_prompts_streaming_pins(pins, model):
    # ComfyUI's free_pins(loaded=True): room for a cache pin, never the prompt's streaming pins.
    streaming, cached = torch.randn(1 << 12), torch.randn(1 << 12)
    pins.mark_prompt([model])
    try:
        pins.cast_to_device(streaming, "cpu", model=model)
        pins.cast_to_device(cached, "cpu", model=model, resident=True)
        assert pins.free_pins(1 << 30, evict_active=True, loaded=True) == (1 << 12) * 4
        assert subset_pins(pins, model, "weights-loaded") == 0
        assert subset_pins(pins, model, "weights") == 1
        assert pins.free_pins(1 << 30) == (1 << 12) * 4
    finally:
        pins.end_prompt()


def test_config_reads_the_settings_in_force(pins):
    before = pins.config()
    assert before["policy"] in ("mru", "lru", "trace", "reuse") and int(before["headroom"]) > 0
    pins.configure(headroom=before["headroom"])  # a size in bytes reads back
    pins.configure("fast_disk:true")
    try:
        assert pins.config()["fast_disk"] == "true"
    finally:
        pins.configure(fast_disk=before["fast_disk"])
    assert pins.config() == before


def test_forget_model_frees_its_pins(pins):
    m = pins.register_model("short-lived", "cpu")
    w = torch.randn(1 << 12)
    pins.cast_to_device(w, "cpu", model=m)
    before = pins.stats()
    pins.forget_model(m)
    assert delta(pins, before, "pinned_bytes") == -(1 << 12) * 4
    with pytest.raises(ValueError, match=f"model {m} is not registered"):
        pins.cast_to_device(w, "cpu", model=m)


def test_set_active_and_stats_table(pins, model):
    pins.set_active(model, True)
    s = pins.stats()
    assert s[f"model.{model}.active"] == 1
    for key in ["pinned_bytes", "committed_bytes", "pins", "hits", "misses", "hit_bytes", "miss_bytes",
                "evictions", "refusals", "weights.bytes", "patches.bytes", "weights-loaded.bytes",
                "patches-loaded.bytes"]:
        assert key in s, key
    table = str(s)
    assert "pinned_bytes" in table and "\n" in table
    pins.set_active(model, False)


def test_node_boundary_relieves_ram_pressure(pins, model):
    other = pins.register_model("node-boundary", "cpu")
    ws = [torch.randn(1 << 14) for _ in range(3)]
    for w in ws:
        pins.cast_to_device(w, "cpu", model=model)
    before = pins.stats()
    pins.configure(headroom="1T")  # available RAM is now far below the headroom
    pins.set_active(other, True)   # a node starts: the pressure check runs
    assert delta(pins, before, "pressure_freed_bytes") >= 3 * (1 << 14) * 4
    assert subset_pins(pins, model, "weights") == 0
    pins.set_active(other, False)
    pins.forget_model(other)


def test_parameters_cast_without_an_autograd_graph(pins, model):
    p = torch.nn.Parameter(torch.randn(32, 8))
    out = pins.cast_to_device(p, "cpu", model=model)
    assert torch.equal(out, p.detach())
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(pins.cast_to_device(p, "cpu", model=model), p.detach())  # the hit too
