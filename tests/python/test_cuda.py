"""The cast path on a CUDA device: pinned DMA, non_blocking with fences. Skips
without a CUDA device (run profiling/gpu_check.sh on a GPU machine)."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_pool_is_cuda_backed_and_pins_are_pinned(pins, model):
    assert pins.stats().get("backend.cuda") == 1
    w = torch.randn(1 << 20)
    out = pins.cast_to_device(w, "cuda", model=model)
    assert out.device.type == "cuda"
    assert torch.equal(out.cpu(), w)
    assert pins.stats()["locked_bytes"] > 0
    assert pins.locked_bytes() == pins.stats()["locked_bytes"]


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
def test_non_blocking_matches_torch(pins, model, dtype):
    w = torch.randn(4096, 257)
    want = w.to("cuda") if dtype is None else w.to("cuda").to(dtype)
    for _ in range(3):  # miss, hit, hit
        got = pins.cast_to_device(w, "cuda", dtype=dtype, non_blocking=True, model=model, resident=True)
        torch.cuda.current_stream().synchronize()
        assert torch.equal(got, want)
    assert pins.stats()[f"model.{model}.weights-loaded.hits"] >= 2


def test_a_pin_with_a_copy_in_flight_is_not_evicted(pins, model):
    w = torch.randn(64 << 20 >> 2)  # 64 MiB
    pins.cast_to_device(w, "cuda", model=model)
    # Keep the stream busy so the next copy is still queued when we try to evict.
    side = torch.randn(8192, 8192, device="cuda")
    for _ in range(20):
        side = side @ side
        side /= side.norm()
    out = pins.cast_to_device(w, "cuda", non_blocking=True, model=model)
    before = pins.stats()["inflight_skips"]
    freed = pins.free_pins(1 << 40)
    if pins.stats()["inflight_skips"] == before:
        pytest.skip("the copy completed before the eviction could see it in flight")
    assert freed < w.numel() * 4 or pins.stats()["pool_deferred_frees"] > 0
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), w)


def test_cuda_source_is_refused_with_a_clear_error(pins, model):
    with pytest.raises(ValueError, match=r"source must be a CPU tensor, got device cuda"):
        pins.cast_to_device(torch.randn(4, device="cuda"), "cuda", model=model)


@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_gathered_cast_matches_torch_on_the_device(pins, model, dtype):
    with torch.inference_mode():
        weight, bias = torch.randn(1024, 257, dtype=torch.float16), torch.randn(1024)
    for _ in range(3):  # miss, hit, hit
        w, b = pins.cast_many_to_device([weight, bias], "cuda", dtype=dtype, non_blocking=True, model=model)
        torch.cuda.current_stream().synchronize()
        assert w.device.type == "cuda" and b.device.type == "cuda"
        assert torch.equal(w, weight.to("cuda").to(dtype or weight.dtype))
        assert torch.equal(b, bias.to("cuda").to(dtype or bias.dtype))
    assert pins.stats()[f"model.{model}.hits"] == 2


def test_out_on_the_device_with_non_blocking(pins, model):
    w = torch.randn(2048, 129)
    buf = torch.empty(2048, 129, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # the caller's stream: the copy runs there
        for _ in range(2):
            pins.cast_to_device(w, "cuda", dtype=torch.bfloat16, non_blocking=True, model=model, out=buf)
    stream.synchronize()
    assert torch.equal(buf, w.to("cuda").to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"out must be on the device cuda"):
        pins.cast_to_device(w, "cuda", model=model, out=torch.empty(2048, 129))


# Note [Chunked fill] (ops/cast_path.h): a miss to the device of a source of
# several 4 MiB chunks fills the pin and transfers it a chunk at a time, the
# transfers queued while the next chunk fills; the last chunk is partial. The
# result, and the pin the hit then reads, hold the bytes of a whole fill,
# blocking or not, converted on the device or not, and into out= too.
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_a_large_miss_fills_and_transfers_in_chunks(pins, model, dtype, non_blocking):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(5 * (1 << 21) + 4099, generator=g).to(torch.float16).reshape(-1, 1)  # 20 MiB and a bit
    want = w.to("cuda") if dtype is None else w.to("cuda").to(dtype)
    before = pins.stats()
    for _ in range(2):  # the miss (chunked), then the hit from the pin it filled
        got = pins.cast_to_device(w, "cuda", dtype=dtype, non_blocking=non_blocking, model=model)
        torch.cuda.current_stream().synchronize()
        assert got.shape == w.shape and torch.equal(got, want)
    assert pins.stats()[f"model.{model}.weights.misses"] - before.get(f"model.{model}.weights.misses", 0) == 1
    w2 = w + 1
    out = torch.empty(w2.shape, dtype=want.dtype, device="cuda")
    for _ in range(2):
        out.zero_()
        assert pins.cast_to_device(w2, "cuda", dtype=dtype, non_blocking=non_blocking, model=model, out=out) is out
        torch.cuda.current_stream().synchronize()
        assert torch.equal(out, w2.to("cuda").to(want.dtype))
