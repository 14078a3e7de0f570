"""Copies that overlap compute, for :mod:`torch_pins.nn`: the next units' weights
go to the device on a side stream while the current unit runs.

Note [Copies that overlap compute]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A streamed module (Note [Streamed modules] in ``torch_pins/nn.py``) casts a
unit's tensors when the unit's forward starts. With ``prefetch=d`` the casts of
the ``d`` units that followed it in the module's previous call are issued at
that moment too, on a side stream of the device (one per device, made once),
so their transfers run while the current unit computes: what diffusers'
group offloading does with ``use_stream``, ComfyUI with its offload stream.

- Each cast issued ahead records an event on the side stream after its copies;
  when its unit starts, the compute stream (the stream current there) waits for
  that event alone: never a wait for a whole stream, never a host sync.
- Its results were allocated on the side stream and are read on the compute
  stream: ``record_stream(compute)`` tells torch's caching allocator, which then
  reuses their memory only once the compute stream has passed the work queued
  before they were released, with no sync either.
- The pins being read stay leased until their copies are done: the casts are
  ``non_blocking`` and pins fences each pin on the stream its copy was queued on
  (``ops/cast_path.h``, "fence"), the side stream here.
- A cast issued ahead remembers its sources' version counters; if one moved
  before its unit starts (a write meanwhile), the copies are dropped and cast
  again (``prefetch_stale``), so the staleness contract holds as without
  prefetch. A unit that starts out of the predicted order is cast on the
  compute stream as without prefetch and the prediction goes on from where it
  is found again; casts issued ahead and unused when the call ends are dropped
  (``prefetch_unused``). A cast ahead that raises (out of device memory) stops
  this round of casts ahead (``prefetch_failed``): its unit is cast when it
  starts, which raises what persists. The first call has nothing to follow: it
  only records.

Device memory: the running unit, its enclosing units (a parent's own tensors)
and up to ``d`` units cast ahead. The seam between this logic and the device is
:class:`Streams`: :class:`CudaStreams` is torch.cuda's; :class:`InOrder`, for
any other device (the CPU), casts where it is asked and does nothing else, so
the same scheduling runs in order there and tests drive it with a seam that
logs each call.
"""
import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch


class Streams:
    """The device side of the prefetch: streams, events, and the caching
    allocator's record of which stream reads a tensor."""

    def current(self) -> Any:
        """The stream the running code queues on (the compute stream)."""
        return None

    def side(self) -> Any:
        """The stream casts issued ahead are queued on."""
        return None

    def on(self, stream: Any) -> Any:
        """A context in which ``stream`` is current."""
        return contextlib.nullcontext()

    def record(self, stream: Any) -> Any:
        """An event marking what ``stream`` has queued so far."""
        return None

    def wait(self, stream: Any, event: Any) -> None:
        """``stream`` waits for ``event`` (the device waits; the host does not)."""

    def hand_over(self, tensors: Sequence[torch.Tensor], stream: Any) -> None:
        """``tensors``, allocated on another stream, are read on ``stream`` too."""


class InOrder(Streams):
    """Any device without streams (the CPU): every cast runs where it is asked."""


class CudaStreams(Streams):
    """torch.cuda's streams and events for ``device``."""

    _side: Dict[torch.device, Any] = {}  # one side stream per device, for every streamed module

    def __init__(self, device: torch.device):
        self.device = device

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def side(self) -> Any:
        stream = CudaStreams._side.get(self.device)
        if stream is None:
            stream = CudaStreams._side[self.device] = torch.cuda.Stream(device=self.device)
        return stream

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def record(self, stream: Any) -> Any:
        return stream.record_event()

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def hand_over(self, tensors: Sequence[torch.Tensor], stream: Any) -> None:
        for t in tensors:
            t.record_stream(stream)


def streams_for(device: torch.device) -> Streams:
    """The seam for ``device``: CUDA streams on a CUDA device, in order elsewhere."""
    return CudaStreams(device) if device.type == "cuda" else InOrder()


class Prefetcher:
    """Which casts run ahead, and when the compute stream waits for them (Note
    [Copies that overlap compute]). ``cast(unit)`` returns an object with
    ``results`` (the device tensors) and ``fresh()`` (its sources unwritten
    since); units are compared by identity."""

    def __init__(self, streams: Streams, depth: int, counts: Dict[str, int]):
        self.streams = streams
        self.depth = depth
        self.counts = counts  # the streamed module's counters, added to here
        self.order: List[Any] = []  # the units of the previous call, in the order they started
        self._started: List[Any] = []  # this call's
        self._ahead: Dict[int, Any] = {}  # id(unit) -> (unit, copies, event): issued ahead, not taken yet
        self._cursor = 0  # where this call is in `order`

    def begin(self) -> None:
        """A call of the module starts."""
        self._started = []
        self._cursor = 0

    def take(self, unit: Any, cast: Callable[[Any], Any]) -> Any:
        """The copies of ``unit``, whose forward starts now: those issued ahead
        (the compute stream waits for their event) or cast now on the compute
        stream; then the casts of the units predicted next are issued ahead."""
        self._started.append(unit)
        ahead = self._ahead.pop(id(unit), None)
        copies = None
        if ahead is not None:
            _, copies, event = ahead
            if copies.fresh():
                current = self.streams.current()
                self.streams.wait(current, event)
                self.streams.hand_over(copies.results, current)
                self.counts["prefetch_used"] += 1
            else:
                self.counts["prefetch_stale"] += 1
                copies = None
        if copies is None:
            copies = cast(unit)
        if self.depth:
            self._issue_after(unit, cast)
        return copies

    def _issue_after(self, unit: Any, cast: Callable[[Any], Any]) -> None:
        at = next((i for i in range(self._cursor, len(self.order)) if self.order[i] is unit), None)
        if at is None:
            return  # a departure from the previous call's order: nothing to predict from here
        self._cursor = at + 1
        side = None
        for nxt in self.order[at + 1:at + 1 + self.depth]:
            if nxt is unit or id(nxt) in self._ahead or nxt.busy():
                continue
            if side is None:
                side = self.streams.side()
            try:
                with self.streams.on(side):
                    copies = cast(nxt)
                    event = self.streams.record(side)
            except Exception:
                # Out of device memory ahead of time, say: the unit is cast
                # when it starts, where an error that persists is raised.
                self.counts["prefetch_failed"] += 1
                return
            self._ahead[id(nxt)] = (nxt, copies, event)
            self.counts["prefetched"] += 1

    def end(self) -> None:
        """The call ended (also by an exception): copies issued ahead and not
        taken are dropped, and this call's order is what the next follows."""
        self.counts["prefetch_unused"] += len(self._ahead)
        self._ahead.clear()
        self.order = self._started
        self._started = []

    def pending(self) -> int:
        """Casts issued ahead and not taken yet."""
        return len(self._ahead)


def check_depth(prefetch: Optional[int], device: torch.device) -> int:
    """``prefetch`` as a depth: None is 1 on a CUDA device and 0 elsewhere."""
    if prefetch is None:
        return 1 if device.type == "cuda" else 0
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"stream: prefetch must be None or an int >= 0, got {type(prefetch).__name__} {prefetch!r}")
    return prefetch
