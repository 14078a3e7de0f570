"""The staleness contract (docs/USAGE.md "Staleness", DESIGN.md "Staleness", Note [Pin
validity]): what pins sees by itself, what the caller reports with invalidate(),
invalidate_model() or a signature; node boundaries and per-model options."""
import gc

import numpy as np
import pytest
import torch


def delta(pins, before, key):
    return pins.stats().get(key, 0) - before.get(key, 0)


def subset_pins(pins, model, subset):
    return pins.stats()[f"model.{model}.{subset}.pins"]


@pytest.fixture
def checked(pins):
    """Note [Content check] on: the content_check key, off by default for its cost on a cold hit."""
    pins.configure(content_check=True)


# --- weights without a version counter -----------------------------------------------

def test_weights_made_in_inference_mode_hit_from_the_second_cast(pins, model):
    with torch.inference_mode():  # as ComfyUI's executor loads every model
        weights = [torch.randn(64, 32), torch.randn(64), torch.randn(16, 16, 3, 3)]
    assert all(w.is_inference() for w in weights)
    before = pins.stats()
    for step in range(3):
        for w in weights:
            with torch.inference_mode():
                out = pins.cast_to_device(w, "cpu", dtype=torch.float16, model=model)
            assert torch.equal(out, w.to(torch.float16))
    assert delta(pins, before, "misses") == len(weights), "one miss per distinct weight"
    assert delta(pins, before, "hits") == 2 * len(weights), "every later cast hits"
    assert delta(pins, before, "pins") == len(weights)
    assert delta(pins, before, "bypassed") == 0


def test_an_inference_weight_written_in_place_is_fresh_without_invalidate(pins, model, checked):
    with torch.inference_mode():  # as ComfyUI loads its models
        w = torch.randn(64, 1024)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)
    with torch.inference_mode():
        w.mul_(2)  # an inference tensor has no version counter: only Note [Content check] sees this
    before = pins.stats()
    out = pins.cast_to_device(w, "cpu", model=model)
    assert torch.equal(out, w), "the pin served the bytes from before the write"
    assert delta(pins, before, "hits") == 0 and delta(pins, before, "misses") == 1
    assert delta(pins, before, "content_mismatches") == 1
    assert delta(pins, before, f"model.{model}.content_mismatches") == 1
    assert delta(pins, before, f"model.{model}.weights.content_mismatches") == 1
    assert delta(pins, before, "dropped") == 1 and delta(pins, before, "pins") == 0, "re-pinned"
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)
    assert delta(pins, before, "hits") == 1, "the new pin serves the next cast"


def test_an_inference_weight_rewritten_in_place_is_fresh_after_invalidate(pins, model):
    with torch.inference_mode():
        w = torch.zeros(1024)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)
    with torch.inference_mode():
        w.add_(1)  # no version counter sees this write
    # By the contract the caller reports such a write: Note [Content check],
    # off by default, would catch this one, not a write that misses its windows.
    assert pins.invalidate(w) == w.numel() * 4
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.ones(1024))
    assert delta(pins, before, "misses") == 1
    assert pins.stats()[f"model.{model}.invalidated"] == 1
    assert pins.invalidate(w) == w.numel() * 4, "the new pin is invalidated in turn"


def test_a_write_through_data_is_fresh_after_invalidate(pins, model):
    p = torch.nn.Parameter(torch.zeros(256, 4), requires_grad=False)
    assert pins.cast_to_device(p, "cpu", model=model).sum() == 0
    p.data.copy_(torch.full((256, 4), 3.0))  # comfy.utils.copy_to_param; .data has its own counter
    pins.invalidate(p)
    assert torch.equal(pins.cast_to_device(p, "cpu", model=model), torch.full((256, 4), 3.0))


def test_a_write_through_a_numpy_alias_is_fresh_after_invalidate(pins, model):
    w = torch.zeros(512)
    pins.cast_to_device(w, "cpu", model=model)
    w.numpy()[:] = 7.0  # shares the bytes, not the version counter
    pins.invalidate(w)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.full((512,), 7.0))


def _rewrite_through_from_numpy(w, tmp_path):
    torch.from_numpy(w.numpy())[:] = 7.0  # a second tensor over the same bytes, its own counter


def _rewrite_through_frombuffer(w, tmp_path):
    torch.frombuffer(memoryview(w.numpy()), dtype=torch.float32)[:] = 7.0


def _rewrite_through_untyped_storage(w, tmp_path):
    w.untyped_storage().copy_(torch.full((512,), 7.0).untyped_storage())


def _rewrite_the_file_under_its_mmap(w, tmp_path):
    # `w` is mapped from the file (below): a write to the file is a write to w.
    with open(tmp_path / "weights.bin", "r+b") as f:
        f.write(np.full(512, 7.0, dtype=np.float32).tobytes())


@pytest.mark.parametrize("rewrite", [_rewrite_through_from_numpy, _rewrite_through_frombuffer,
                                     _rewrite_through_untyped_storage, _rewrite_the_file_under_its_mmap],
                         ids=lambda f: f.__name__.lstrip("_"))
def test_writes_no_version_counter_sees_are_fresh_after_invalidate(pins, model, rewrite, tmp_path):
    # The contract without Note [Content check] (off by default).
    if rewrite is _rewrite_the_file_under_its_mmap:
        (tmp_path / "weights.bin").write_bytes(np.zeros(512, dtype=np.float32).tobytes())
        w = torch.from_file(str(tmp_path / "weights.bin"), shared=True, size=512, dtype=torch.float32)
    else:
        w = torch.zeros(512)
    version = w._version
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.zeros(512))
    rewrite(w, tmp_path)
    assert torch.equal(w, torch.full((512,), 7.0)) and w._version == version, "a write the counter misses"
    # Not detected by pins (docs/USAGE.md "Staleness"): the pin still holds the old bytes.
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.zeros(512))
    assert pins.invalidate(w) == 512 * 4
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.full((512,), 7.0))


@pytest.mark.parametrize("rewrite", [_rewrite_through_from_numpy, _rewrite_through_frombuffer,
                                     _rewrite_through_untyped_storage],
                         ids=lambda f: f.__name__.lstrip("_"))
def test_whole_tensor_writes_no_version_counter_sees_are_caught_by_the_content_check(pins, model, checked, rewrite,
                                                                                    tmp_path):
    w = torch.zeros(512)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.zeros(512))
    rewrite(w, tmp_path)
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.full((512,), 7.0))  # no invalidate
    assert delta(pins, before, "content_mismatches") == 1 and delta(pins, before, "misses") == 1


def test_a_source_in_memory_torch_did_not_allocate_is_checked_too(pins, model, checked):
    # numpy's memory: not torch's CPU allocator's, so pagemap says whether it is anonymous (it is).
    array = np.random.default_rng(0).random(4096, dtype=np.float32)
    w = torch.from_numpy(array)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)
    array *= 2  # through numpy: no version counter sees it
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)
    assert delta(pins, before, "content_mismatches") == 1


def test_a_file_mapping_is_never_read_by_the_content_check(pins, model, checked, tmp_path):
    # Note [Content check]: its pages are a file's, and reading them could read the disk; a
    # file rewritten under a mapping other than load_file's stays the caller's to report.
    (tmp_path / "weights.bin").write_bytes(np.zeros(512, dtype=np.float32).tobytes())
    w = torch.from_file(str(tmp_path / "weights.bin"), shared=True, size=512, dtype=torch.float32)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.zeros(512))
    _rewrite_the_file_under_its_mmap(w, tmp_path)
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.zeros(512)), "served from the pin"
    assert delta(pins, before, "hits") == 1 and delta(pins, before, "content_mismatches") == 0
    pins.invalidate(w)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.full((512,), 7.0))


def test_a_strided_inference_weight_written_in_place_is_fresh(pins, model, checked):
    with torch.inference_mode():
        base = torch.randn(96, 160)
        views = [base.t(), base[:, 3:131], base[::2, ::5]]  # runs of one element, rows, both strided
    assert not any(v.is_contiguous() for v in views)
    for v in views:
        assert torch.equal(pins.cast_to_device(v, "cpu", model=model), v)
    with torch.inference_mode():
        base.mul_(2)
    before = pins.stats()
    for v in views:
        assert torch.equal(pins.cast_to_device(v, "cpu", model=model), v)
    assert delta(pins, before, "content_mismatches") == len(views) and delta(pins, before, "hits") == 0


def test_the_content_check_is_off_by_default_and_its_key_turns_it_on(pins, model):
    with torch.inference_mode():
        w = torch.randn(4096)
    old = pins.cast_to_device(w, "cpu", model=model)  # made with the check off: no windows
    with torch.inference_mode():
        w.add_(1)
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), old), "off: served from the pin (the contract)"
    assert delta(pins, before, "hits") == 1 and delta(pins, before, "content_mismatches") == 0
    pins.configure(content_check=True)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), old), "a pin made while it was off: no windows"
    pins.invalidate(w)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)  # made again, with windows
    with torch.inference_mode():
        w.add_(1)
    before = pins.stats()
    new = pins.cast_to_device(w, "cpu", model=model)
    assert torch.equal(new, w) and delta(pins, before, "content_mismatches") == 1
    pins.configure(content_check=False)  # turned off again: its pins are not compared
    with torch.inference_mode():
        w.add_(1)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), new)


def test_set_to_another_storage_is_a_new_source(pins, model):
    w = torch.zeros(512)
    pins.cast_to_device(w, "cpu", model=model)
    w.set_(torch.full((512,), 7.0).untyped_storage())  # other bytes: another key, no invalidate needed
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), torch.full((512,), 7.0))


def test_a_content_signature_change_is_fresh_without_invalidate(pins, model):
    with torch.inference_mode():
        w = torch.zeros(2048)
    assert pins.cast_to_device(w, "cpu", model=model, signature=1).sum() == 0
    with torch.inference_mode():
        w.fill_(5.0)
    before = pins.stats()
    out = pins.cast_to_device(w, "cpu", model=model, signature=2)  # the caller's new content id
    assert torch.equal(out, torch.full((2048,), 5.0))
    assert delta(pins, before, "misses") == 1 and delta(pins, before, "dropped") == 1
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model, signature=2), out)
    assert delta(pins, before, "hits") == 1


def test_invalidate_drops_exactly_the_overlapping_pins(pins, model):
    base = torch.arange(4096, dtype=torch.float32)
    first, second = base[:2048], base[2048:]
    strided = base[1::64]  # reaches bytes [4, 4096*4 - 252)
    for t in (first, second, strided):
        pins.cast_to_device(t, "cpu", model=model)
    other = pins.register_model("contract-other", "cpu")
    pins.cast_to_device(second, "cpu", model=other, resident=True)
    assert pins.stats()["model.contract-other.weights-loaded.pins"] == 1
    # An element of `second`: its pins in both models, and the strided view's.
    dropped = pins.invalidate(base[4000:4001])  # not an element of `strided`, but inside its span
    assert dropped == 2 * 2048 * 4 + strided.numel() * 4
    assert subset_pins(pins, model, "weights") == 1, "`first` does not overlap"
    assert subset_pins(pins, other, "weights-loaded") == 0
    assert pins.invalidate(torch.zeros(4)) == 0, "another storage"
    assert pins.invalidate(base[:0]) == 0, "no bytes"
    pins.forget_model(other)


def test_invalidate_takes_a_tensor_that_died_before_the_sweep(pins, model):
    w = torch.randn(1 << 12)
    pins.cast_to_device(w, "cpu", model=model)
    del w
    gc.collect()
    pins.end_node()  # the node boundary sweeps dead sources
    assert subset_pins(pins, model, "weights") == 0


def test_invalidate_model_drops_that_models_pins_only(pins, model):
    other = pins.register_model("contract-keep", "cpu")
    ws = [torch.randn(128) for _ in range(3)]
    pins.cast_to_device(ws[0], "cpu", model=model)
    pins.cast_to_device(ws[1], "cpu", model=model, resident=True)
    pins.cast_to_device(ws[2], "cpu", model=model, kind="patches")
    pins.cast_to_device(ws[0], "cpu", model=other)
    assert pins.invalidate_model(model) == 3 * 128 * 4
    s = pins.stats()
    assert s[f"model.{model}.pins"] == 0 and s[f"model.{model}.invalidated"] == 3
    assert s[f"model.{other}.pins"] == 1
    before = pins.stats()
    pins.cast_to_device(ws[0], "cpu", model=model)  # still registered: pinned again
    assert delta(pins, before, f"model.{model}.misses") == 1
    assert pins.invalidate_model(other) == 128 * 4
    pins.forget_model(other)


# --- node boundaries ------------------------------------------------------------------

def test_end_node_drops_patches_clears_active_and_keeps_the_prompt(pins, model):
    other = pins.register_model("contract-node", "cpu")
    lora, lora_loaded, w = torch.randn(64), torch.randn(64), torch.randn(64)
    pins.mark_prompt([model, other])
    pins.set_active(model, True)
    pins.set_active(other, True)
    pins.cast_to_device(lora, "cpu", model=model, kind="patches")
    pins.cast_to_device(lora_loaded, "cpu", model=model, kind="patches", resident=True, signature=3)
    pins.cast_to_device(w, "cpu", model=model)
    pins.end_node()
    s = pins.stats()
    assert s["prompt"] == 1, "the prompt goes on"
    for m in (model, other):
        assert s[f"model.{m}.active"] == 0
        assert s[f"model.{m}.in_prompt"] == 1
    assert s[f"model.{model}.patches.pins"] == 0
    assert s[f"model.{model}.patches-loaded.pins"] == 1
    assert s[f"model.{model}.weights.pins"] == 1
    pins.end_prompt()
    assert pins.stats()["prompt"] == 0
    pins.forget_model(other)


# --- per-model options ----------------------------------------------------------------

def test_a_fast_disk_model_never_gets_loaded_pins(pins):
    fast = pins.register_model("contract-fast", "cpu", fast_disk=True)
    slow = pins.register_model("contract-slow", "cpu")
    a, b, p = torch.randn(256), torch.randn(256), torch.randn(16)
    for _ in range(2):
        pins.cast_to_device(a, "cpu", model=fast, resident=True)
        pins.cast_to_device(p, "cpu", model=fast, kind="patches", resident=True, signature=1)
        pins.cast_to_device(b, "cpu", model=slow, resident=True)
    s = pins.stats()
    assert s[f"model.{fast}.weights-loaded.pins"] == 0 and s[f"model.{fast}.patches-loaded.pins"] == 0
    assert s[f"model.{fast}.weights.pins"] == 1 and s[f"model.{fast}.patches.pins"] == 1
    assert s[f"model.{fast}.hits"] == 2, "streaming pins serve it"
    assert s[f"model.{slow}.weights-loaded.pins"] == 1
    assert s[f"model.{fast}.fast_disk"] == 1 and s[f"model.{slow}.fast_disk"] == 0
    pins.forget_model(fast)
    pins.forget_model(slow)


def test_register_model_keeps_its_two_argument_forms(pins):
    @torch.jit.script
    def register(name: str) -> int:
        return torch.ops.pins.register_model(name, torch.device("cpu"))

    m = register("contract-scripted")
    m2 = torch.ops.pins.register_model("contract-ops", torch.device("cpu"))
    m3 = torch.ops.pins.register_model("contract-ops-fast", torch.device("cpu"), True)
    s = pins.stats()
    assert s[f"model.{m}.fast_disk"] == 0 and s[f"model.{m2}.fast_disk"] == 0 and s[f"model.{m3}.fast_disk"] == 1
    for x in (m, m2, m3):
        pins.forget_model(x)


# --- counters -------------------------------------------------------------------------

def test_bypassed_counts_each_reason(pins, model):
    before = pins.stats()
    # empty: no bytes to pin
    assert pins.cast_to_device(torch.empty(0, 4), "cpu", model=model).shape == (0, 4)
    # refused: the budget cannot leave the headroom free
    pins.configure(headroom="1T")
    w = torch.randn(1000)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)
    pins.configure(headroom="4G")
    # pool: the pool's cap refuses the block while the budget has room (its
    # idle memory, kept warm from earlier tests, would serve it without a
    # commit for the cap to refuse: free_pins gives it back first)
    pins.free_pins(1 << 40)
    pins.configure(cap="1")
    big = torch.randn(1 << 20)
    assert torch.equal(pins.cast_to_device(big, "cpu", model=model), big)
    pins.configure(cap="0")
    # plain copies by request
    pins.cast_to_device(w, "cpu")
    pins.cast_many_to_device([w, big], "cpu")
    for key, n in (("bypassed.empty", 1), ("bypassed.refused", 1), ("bypassed.pool", 1), ("bypassed", 3),
                   (f"model.{model}.bypassed.empty", 1), (f"model.{model}.bypassed.refused", 1),
                   (f"model.{model}.bypassed.pool", 1), (f"model.{model}.bypassed", 3),
                   ("plain_copies", 3), ("refusals", 2), ("pins", 0)):
        assert delta(pins, before, key) == n, key
    s = pins.stats()
    reasons = ("empty", "refused", "pool", "busy", "raced", "forgotten", "unlocking")
    assert s["bypassed"] == sum(s[f"bypassed.{r}"] for r in reasons), "the total is the sum of the reasons"
    assert "plain_copies" not in {k.split(".", 2)[-1] for k in s if k.startswith("model.")}, "global only"


def test_stats_by_name_beside_id(pins):
    a = pins.register_model("contract-named", "cpu")
    b = pins.register_model("contract-named", "cpu")  # a repeated name
    c = pins.register_model("42", "cpu")  # a name that reads as an id
    w = torch.randn(64)
    pins.cast_to_device(w, "cpu", model=a)
    pins.cast_to_device(w, "cpu", model=a)
    pins.cast_to_device(w, "cpu", model=b)
    s = pins.stats()
    assert s["model.contract-named.hits"] == s[f"model.{a}.hits"] == 1
    assert s["model.contract-named.id"] == a, "the lowest id keeps the bare name"
    assert s[f"model.contract-named#{b}.misses"] == 1 and s[f"model.contract-named#{b}.id"] == b
    assert s[f"model.42#{c}.id"] == c
    assert s[f"model.contract-named.weights.pins"] == 1
    for m in (a, b, c):
        pins.forget_model(m)
    assert "model.contract-named.hits" not in pins.stats()


def test_summary_names_the_models_and_the_hit_rate(pins):
    m = pins.register_model("contract-summary-unet", "cpu", fast_disk=True)
    w = torch.randn(1024)
    for _ in range(4):
        pins.cast_to_device(w, "cpu", model=m)
    pins.cast_to_device(torch.empty(0), "cpu", model=m)
    text = pins.summary()
    assert isinstance(text, str) and 3 <= len(text.splitlines()) <= 4 + pins.stats()["models"]
    line = next(l for l in text.splitlines() if "contract-summary-unet" in l)
    assert line.startswith(f"model {m} 'contract-summary-unet' (cpu, fast_disk): 1 pins, 4.0 KiB, 3 hits, 1 misses")
    assert "1 bypassed (empty 1)" in line
    assert "hit rate" in text and "plain copies" in text and "weights-loaded" in text
    pins.forget_model(m)
    assert "contract-summary-unet" not in pins.summary()
