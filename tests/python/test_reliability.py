"""The reliability promises (docs/RELIABILITY.md) as seen from Python: pins of
dead sources are reclaimed with no boundary, free or pressure
(Note [Dead source reclaim] in csrc/balancer/reclaim_ring.h), and lifetime totals
never decrease."""
import torch

RECLAIM_PER_CALL = 8  # Balancer::kReclaimPerCall


def test_pins_of_dead_sources_are_reclaimed_without_a_boundary(pins, model):
    keep = torch.randn(64)
    pins.cast_to_device(keep, "cpu", model=model)
    sources = [torch.randn(16 * 1024) for _ in range(200)]  # 64 KiB each
    for w in sources:
        pins.cast_to_device(w, "cpu", model=model)
    s = pins.stats()
    assert s[f"model.{model}.pins"] == 201, "every source pinned"
    assert s[f"model.{model}.bytes"] == 200 * 64 * 1024 + keep.nbytes
    bound = s["pins"] // (RECLAIM_PER_CALL - 1) + 2  # every pin of the process is in the ring
    del w, sources  # 200 sources die; no end_prompt, end_node, free_pins or pressure follows
    casts = 0
    while pins.stats()[f"model.{model}.pins"] > 1 and casts < 10 * bound:
        pins.cast_to_device(keep, "cpu", model=model)  # a hit: the only call made
        casts += 1
    s = pins.stats()
    assert s[f"model.{model}.bytes"] == keep.nbytes, "pins of dead sources kept their memory"
    assert casts <= bound, f"reclaimed only after {casts} casts (bound {bound})"
    assert s[f"model.{model}.dropped"] == 200
    assert s[f"model.{model}.hits"] == casts


def test_lifetime_totals_never_decrease(pins):
    m = pins.register_model("reliability-totals", "cpu")
    w = torch.randn(256)
    pins.cast_to_device(w, "cpu", model=m)
    pins.cast_to_device(w, "cpu", model=m)
    before = pins.stats()
    assert before[f"model.{m}.hits"] == 1
    pins.forget_model(m)
    after = pins.stats()
    for key in ("hits", "misses", "hit_bytes", "miss_bytes", "evictions", "evicted_bytes", "dropped",
                "invalidated", "weights.hits", "weights.misses"):
        assert after[key] >= before[key], key
    assert after["hits"] == before["hits"] and after["misses"] == before["misses"]
    assert after["dropped"] == before["dropped"] + 1, "forgetting drops its pin"
    assert after["pins"] == before["pins"] - 1 and after["pinned_bytes"] == before["pinned_bytes"] - w.nbytes
