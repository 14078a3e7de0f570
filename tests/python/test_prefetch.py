"""Copies that overlap compute (Note [Copies that overlap compute]): the order of
casts, waits and forwards, driven on the CPU through a stream seam that logs
every call, and on a CUDA device where there is one."""
import contextlib

import pytest
import torch

from nn_models import Net, block_units


class LogStreams:
    """The seam of torch_pins._prefetch (Streams), logging each call; its streams
    are names. It has no other method: a stream-wide sync would be an AttributeError."""

    def __init__(self, log):
        self.log = log
        self.now = "compute"
        self.events = 0

    def current(self):
        return self.now

    def side(self):
        return "side"

    @contextlib.contextmanager
    def on(self, stream):
        before, self.now = self.now, stream
        try:
            yield
        finally:
            self.now = before

    def record(self, stream):
        self.events += 1
        event = f"e{self.events}"
        self.log.append(("record", stream, event))
        return event

    def wait(self, stream, event):
        self.log.append(("wait", stream, event))

    def hand_over(self, tensors, stream):
        self.log.append(("hand_over", stream, len(tensors)))


@pytest.fixture
def logged(pins, monkeypatch):
    """stream() with the logging seam; casts and unit forwards logged in one list."""
    import torch_pins._prefetch as prefetch
    import torch_pins._units as units
    import torch_pins.nn as pnn
    log = []
    seam = LogStreams(log)
    monkeypatch.setattr(prefetch, "streams_for", lambda device: seam)
    real = units.cast_many_to_device

    def cast_many(sources, *args, **kwargs):
        log.append(("cast", seam.now, tuple(sources[0].shape)))
        return real(sources, *args, **kwargs)
    monkeypatch.setattr(units, "cast_many_to_device", cast_many)

    def stream(net, **kwargs):
        s = pins.stream(net, "cpu", **kwargs)
        names = dict(net.named_modules())
        for u in s.units:  # after stream's own pre-hooks: runs when the unit's forward starts
            names[u].register_forward_pre_hook(lambda m, a, u=u: log.append(("forward", u)))
        return s
    stream.seam = seam
    yield log, stream
    for m in list(pnn._roots.keys()):
        pnn.unstream(m)


def shape_of(net, unit):
    """The shape of the largest tensor of `unit` (its cast is logged by it)."""
    module = dict(net.named_modules())[unit]
    tensors = [t for m in ([module] if unit == "" else module.modules())
               for t in list(m._parameters.values()) + list(m._buffers.values()) if t is not None]
    return tuple(max(tensors, key=lambda t: t.nbytes).shape)


@pytest.mark.parametrize("depth", [1, 2])
def test_the_next_units_are_cast_on_the_side_stream_while_a_unit_runs(logged, depth):
    log, stream = logged
    net, plain = Net(n=4).eval(), Net(n=4).eval()
    s = stream(net, prefetch=depth)
    units = block_units(4)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(net(x), plain(x))
        first = list(log)
        assert [e[0] for e in first] == ["cast", "forward"] * len(units), "the first call records the order only"
        assert all(e[1] == "compute" for e in first if e[0] == "cast")
        del log[:]
        assert torch.equal(net(x), plain(x))
    forward_at = {e[1]: i for i, e in enumerate(log) if e[0] == "forward"}
    assert list(forward_at) == units
    casts = [(i, e) for i, e in enumerate(log) if e[0] == "cast"]
    assert casts[0][1][1] == "compute" and len(casts) == len(units), "only the first unit is cast where it runs"
    for j, unit in enumerate(units[1:], start=1):
        # Unit j was cast ahead on the side stream when unit j-depth started,
        # before that unit's forward (so the copy overlaps it).
        at, (_, stream_name, shape) = casts[j]
        assert stream_name == "side" and shape == shape_of(net, unit), unit
        issuer = max(j - depth, 0)
        assert at < forward_at[units[issuer]] and (issuer == 0 or at > forward_at[units[issuer - 1]]), unit
        assert log[at + 1][:2] == ("record", "side")
        event = log[at + 1][2]
        # The compute stream waits for that event alone, then reads the copies.
        waits = [i for i, e in enumerate(log) if e[0] == "wait"]
        mine = [i for i in waits if log[i][2] == event]
        assert len(mine) == 1 and log[mine[0]][1] == "compute" and mine[0] < forward_at[unit], unit
        assert log[mine[0] + 1][:2] == ("hand_over", "compute")
    assert len(waits) == len(units) - 1, "no other wait"
    assert s.stats()["prefetched"] == s.stats()["prefetch_used"] == len(units) - 1
    assert s.stats()["prefetch_unused"] == 0


def test_a_departure_from_the_order_still_gives_the_plain_outputs(logged):
    log, stream = logged
    net, plain = Net(n=4).eval(), Net(n=4).eval()
    s = stream(net, prefetch=2)
    x = torch.randn(3, 4)
    with torch.no_grad():
        net(x)
        for order in ([3, 2, 1, 0], [0, 2], [0, 1, 2, 3], [1, 1, 1]):
            net.order = plain.order = order
            assert torch.equal(net(x), plain(x)), order
            assert s._prefetcher.pending() == 0, "what was cast ahead and not used is dropped at the end"
    st = s.stats()
    assert st["prefetch_unused"] > 0 and st["prefetch_used"] > 0
    assert st["prefetched"] == st["prefetch_used"] + st["prefetch_unused"] + st["prefetch_stale"]


def test_a_source_written_after_its_cast_ahead_is_cast_again(logged):
    log, stream = logged
    net, plain = Net(n=3).eval(), Net(n=3).eval()
    s = stream(net, prefetch=1)
    x = torch.randn(3, 4)
    with torch.no_grad():
        net(x)
        plain(x)

        def patch(model):
            def hook(module, args):
                model.blocks[1].up.weight.add_(1.0)  # moves the version counter
            return model.blocks[0].register_forward_hook(lambda m, a, o: hook(m, a))
        handles = [patch(net), patch(plain)]
        assert torch.equal(net(x), plain(x))
        for h in handles:
            h.remove()
    assert s.stats()["prefetch_stale"] == 1


def test_an_exception_drops_the_casts_issued_ahead(logged):
    log, stream = logged
    net = Net(n=3).eval()
    s = stream(net, prefetch=2)
    x = torch.randn(3, 4)
    with torch.no_grad():
        net(x)
        net.order = [0, 9]
        with pytest.raises(IndexError):
            net(x)
        assert s._prefetcher.pending() == 0 and s._depth == 0
        net.order = None
        net(x)


def test_a_cast_ahead_that_fails_is_left_to_the_units_start(logged, monkeypatch):
    import torch_pins._units as units
    log, stream = logged
    net, plain = Net(n=3).eval(), Net(n=3).eval()
    s = stream(net, prefetch=2)
    x = torch.randn(3, 4)
    logging_cast = units.cast_many_to_device

    def failing(sources, *args, **kwargs):
        if stream.seam.now == "side":
            raise RuntimeError("CUDA out of memory (a stand-in)")
        return logging_cast(sources, *args, **kwargs)
    monkeypatch.setattr(units, "cast_many_to_device", failing)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(net(x), plain(x))
    assert s.stats()["prefetch_failed"] > 0 and s.stats()["prefetch_used"] == 0
    assert s._prefetcher.pending() == 0


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetch_in_order_on_the_cpu_gives_the_plain_outputs(pins, depth):
    import torch_pins.nn as pnn
    net, plain = Net(n=5).eval(), Net(n=5).eval()
    s = pins.stream(net, "cpu", prefetch=depth)
    try:
        x = torch.randn(3, 4)
        with torch.inference_mode():
            for _ in range(3):
                assert torch.equal(net(x), plain(x))
        assert s.stats()["prefetch_used"] == (2 * (len(s.units) - 1) if depth else 0)
    finally:
        pnn.unstream(net)


def test_the_default_depth_is_one_on_cuda_and_zero_elsewhere():
    from torch_pins._prefetch import check_depth
    assert check_depth(None, torch.device("cuda", 0)) == 1
    assert check_depth(None, torch.device("cpu")) == 0
    assert check_depth(3, torch.device("cpu")) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_prefetch_on_cuda_gives_the_plain_outputs(pins, depth):
    import torch_pins.nn as pnn
    net, plain = Net(d=256, n=6).eval(), Net(d=256, n=6).eval().to("cuda")
    s = pins.stream(net, "cuda", prefetch=depth)
    try:
        x = torch.randn(64, 4, device="cuda")
        with torch.inference_mode():
            want = plain(x)
            for _ in range(4):
                assert torch.equal(net(x), want)
        torch.cuda.synchronize()
        assert s.stats()["prefetch_used"] == (3 * (len(s.units) - 1) if depth else 0)
        assert pins.stats()[f"model.{s.model}.hits"] == 3 * len(s.units)
    finally:
        pnn.unstream(net)
