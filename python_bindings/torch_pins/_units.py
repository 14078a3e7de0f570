"""The units of a streamed module and their casts, for :mod:`torch_pins.nn`
(Note [Streamed modules] in ``nn.py``): which tensors go to the device together,
and the one gathered transfer that takes them there."""
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
from torch import nn

from . import cast_many_to_device, cast_to_device

LEVELS = ("block", "leaf")
CONTAINERS = (nn.ModuleList, nn.Sequential)
Slot = Tuple[Dict[str, Any], str]  # a module's _parameters or _buffers, and a name in it


def own_slots(m: nn.Module) -> List[Slot]:
    """The slots of ``m``'s own (not its children's) parameters and buffers."""
    return [(m._parameters, k) for k, v in m._parameters.items() if v is not None] + \
           [(m._buffers, k) for k, v in m._buffers.items() if v is not None]


def split(root: nn.Module, level: str) -> List[Tuple[str, nn.Module, List[nn.Module]]]:
    """(name, owner, modules whose own tensors it holds) of every unit, in the
    order of the module tree; one unit per owner."""
    units: List[Tuple[str, nn.Module, List[nn.Module]]] = []
    owners: Set[int] = set()

    def add(name: str, owner: nn.Module, modules: List[nn.Module]) -> None:
        if modules and id(owner) not in owners:
            owners.add(id(owner))
            units.append((name, owner, modules))

    if level == "leaf":
        for name, m in root.named_modules():
            add(name, m, [m] if own_slots(m) else [])
        return units

    def join(prefix: str, name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    def block(name: str, m: nn.Module) -> None:
        add(name, m, [x for x in m.modules() if own_slots(x)])

    def visit(name: str, m: nn.Module) -> None:
        add(name, m, [m] if own_slots(m) else [])
        for child_name, child in m.named_children():
            child_name = join(name, child_name)
            if isinstance(child, CONTAINERS):
                visit_container(child_name, child)
            elif any(isinstance(x, CONTAINERS) for x in child.modules()):
                visit(child_name, child)
            else:
                block(child_name, child)

    def visit_container(name: str, c: nn.Module) -> None:
        add(name, c, [c] if own_slots(c) else [])
        for element_name, element in c.named_children():
            block(join(name, element_name), element)  # a container of layers too: one block

    if isinstance(root, CONTAINERS):
        visit_container("", root)
    else:
        visit("", root)
    return units


def version(t: torch.Tensor) -> Optional[int]:
    """``t``'s version counter; None for an inference tensor, which has none."""
    return None if t.is_inference() else t._version


class Copies:
    """One cast of a unit: its sources, their device copies (``results``), the
    slots each fills, and the version counters of both when cast."""
    __slots__ = ("sources", "results", "places", "versions", "written")

    def __init__(self) -> None:
        self.sources: List[torch.Tensor] = []
        self.results: List[torch.Tensor] = []
        self.places: List[List[Slot]] = []
        self.versions: List[Optional[int]] = []  # the sources'
        self.written: List[Optional[int]] = []  # the results'

    def fresh(self) -> bool:
        """No source was written (as its version counter shows) since the cast."""
        return all(v is None or s._version == v for s, v in zip(self.sources, self.versions))


class Unit:
    """The tensors that go to the device together, for the forward of their owner."""
    __slots__ = ("name", "slots", "hooks", "depth", "saved", "copies")

    def __init__(self, name: str, slots: List[Slot]):
        self.name = name
        self.slots = slots
        self.hooks: List[Any] = []  # the RemovableHandles of its owner's hooks
        self.depth = 0  # forwards of its owner running (a module may call itself)
        self.saved: List[Tuple[Dict[str, Any], str, Any]] = []  # what its copies replaced
        self.copies: Optional[Copies] = None

    def busy(self) -> bool:
        return self.depth > 0


def shared_tensors(units: List[Unit]) -> Set[int]:
    """The ids of tensors held by more than one unit (tied weights)."""
    counted: Dict[int, int] = {}
    for unit in units:
        for t_id in {id(d[key]) for d, key in unit.slots}:
            counted[t_id] = counted.get(t_id, 0) + 1
    return {t_id for t_id, n in counted.items() if n > 1}


def cast(unit: Unit, device: torch.device, model: int, shared: Set[int], counts: Dict[str, int]) -> Copies:
    """The device copies of ``unit``'s CPU tensors, on the current stream: one
    ``cast_many_to_device``, largest first, and one ``cast_to_device`` per
    tensor in ``shared``. A tensor already on ``device`` stays where it is."""
    copies = Copies()
    index: Dict[int, int] = {}
    grad = torch.is_grad_enabled()
    for d, key in unit.slots:
        t = d.get(key)
        if t is None:
            continue
        i = index.get(id(t))
        if i is not None:
            copies.places[i].append((d, key))
            continue
        if t.device.type != "cpu":
            if t.device != device:
                raise ValueError(f"torch_pins.nn: {key!r} of {unit.name or 'the root module'} is on {t.device}; "
                                 f"a streamed module's tensors must be on the CPU (or already on {device})")
            counts["resident"] += 1
            continue
        if grad and t.requires_grad:
            raise RuntimeError(f"torch_pins.nn: {key!r} of {unit.name or 'the root module'} requires grad and grad "
                               f"mode is on: a streamed module runs inference only (its device copies are not "
                               f"parameters); call it under torch.no_grad() or torch.inference_mode()")
        index[id(t)] = len(copies.sources)
        copies.sources.append(t)
        copies.places.append([(d, key)])
    if not copies.sources:
        return copies
    order = sorted(range(len(copies.sources)), key=lambda i: copies.sources[i].nbytes, reverse=True)
    copies.sources = [copies.sources[i] for i in order]
    copies.places = [copies.places[i] for i in order]
    copies.versions = [version(s) for s in copies.sources]
    together = [i for i, s in enumerate(copies.sources) if id(s) not in shared]
    results: List[Any] = [None] * len(copies.sources)
    non_blocking = device.type != "cpu"
    if together:
        cast = cast_many_to_device([copies.sources[i] for i in together], device, non_blocking=non_blocking,
                                   model=model)
        for i, r in zip(together, cast):
            results[i] = r
        counts["gathered"] += 1
    for i, s in enumerate(copies.sources):
        if results[i] is None:
            results[i] = cast_to_device(s, device, non_blocking=non_blocking, model=model)
            counts["single"] += 1
    copies.results = results
    copies.written = [version(r) for r in results]
    counts["unit_casts"] += 1
    return copies
