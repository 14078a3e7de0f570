"""Stand-in for comfy_aimdo.model_vbar: per-model virtual VRAM ranges ("vbars").

Real: a ModelVBAR reserves a large virtual VRAM range for one model; ComfyUI
bump-allocates each layer's slot in it (alloc), and before a layer runs asks
aimdo to back that slot with physical VRAM (vbar_fault), which may evict other
unpinned pages or fail when VRAM is short. A signature tells whether the pages
kept their contents since the last fault.

Here: the range is a CPU uint8 tensor, residency is tracked per page
(PAGE_SIZE bytes, 32 MiB as in aimdo unless configure() says otherwise), and
the "VRAM" is a byte limit shared by all vbars (configure(vram_bytes=...);
None = unlimited). A page that is made resident gets a fresh generation
number; an evicted page is filled with 0xFF (NaN in fp16/bf16/fp32) so stale
reads show. Not modelled: watermarks, malloc_async clamps, NVML pressure,
per-device pools (every vbar shares the one limit), CUDA streams.
"""
import itertools
import weakref

import torch

from . import control

PAGE_SIZE = 32 << 20
VRAM_LIMIT = None
_vbars = weakref.WeakSet()
_generations = itertools.count(1)
_priorities = itertools.count(1)
stats = {"faults": 0, "resident_hits": 0, "ooms": 0, "evicted_pages": 0}


def configure(vram_bytes=None, page_size=32 << 20):
    """Stand-in only: how much "VRAM" faults may back (None: no limit) and the
    page size of vbars created from now on."""
    global VRAM_LIMIT, PAGE_SIZE
    VRAM_LIMIT = None if vram_bytes is None else int(vram_bytes)
    PAGE_SIZE = int(page_size)
    for key in stats:
        stats[key] = 0


def _resident_bytes(device=None):
    return sum(v.loaded_size() for v in list(_vbars) if device is None or v.device == device)


class ModelVBAR:
    def __init__(self, size, device):
        """Real: reserves `size` bytes of virtual VRAM address space on GPU
        `device` (no physical memory yet). Here: an untouched CPU tensor."""
        self._devctx = control.get_devctx(device)
        self.device = device
        self.max_size = int(size)
        self.offset = 0
        self.page_size = PAGE_SIZE
        self._backing = torch.empty(self.max_size, dtype=torch.uint8)
        self.base_addr = self._backing.data_ptr()
        pages = (self.max_size + self.page_size - 1) // self.page_size
        self._generation = [0] * pages  # 0: not resident
        self._pinned = [False] * pages
        self._priority = 0
        _vbars.add(self)

    def prioritize(self, malloc_async_clamp=None):
        """Real: makes this model's pages the last to be evicted (ComfyUI calls
        it when it loads the model). Here: later-prioritized vbars lose pages last."""
        self._priority = next(_priorities)

    def alloc(self, num_bytes):
        """Real: carves the next 512-byte-aligned slot of the range for one
        layer, (vbar, address, size); MemoryError past the end. Same here."""
        self.offset = (self.offset + 511) & ~511
        if self.offset + num_bytes > self.max_size:
            raise MemoryError("VBAR OOM")
        alloc = (self, self.base_addr + self.offset, int(num_bytes))
        self.offset += num_bytes
        return alloc

    def _pages(self, addr, size):
        start = addr - self.base_addr
        if size <= 0:
            return range(0)
        return range(start // self.page_size, (start + size - 1) // self.page_size + 1)

    def _page_bytes(self, page):
        return min(self.page_size, self.max_size - page * self.page_size)

    def _evict(self, page):
        start = page * self.page_size
        self._backing[start:start + self._page_bytes(page)].fill_(0xFF)
        self._generation[page] = 0
        stats["evicted_pages"] += 1
        return self._page_bytes(page)

    def fault(self, addr, size):
        """Real: backs the slot with physical VRAM and pins it, evicting other
        unpinned pages if needed; a signature, or None when VRAM ran out."""
        stats["faults"] += 1
        pages = self._pages(addr, size)
        missing = [p for p in pages if not self._generation[p]]
        need = sum(self._page_bytes(p) for p in missing)
        if VRAM_LIMIT is not None:
            shortfall = _resident_bytes() + need - VRAM_LIMIT
            if shortfall > 0:
                victims = sorted(((v._priority, -p, id(v), v, p) for v in list(_vbars)
                                  for p, gen in enumerate(v._generation)
                                  if gen and not v._pinned[p] and not (v is self and p in pages)),
                                 key=lambda t: t[:3])
                chosen = []
                for *_, v, p in victims:
                    if shortfall <= 0:
                        break
                    chosen.append((v, p))
                    shortfall -= v._page_bytes(p)
                if shortfall > 0:
                    stats["ooms"] += 1
                    return None
                for v, p in chosen:
                    v._evict(p)
        if not missing:
            stats["resident_hits"] += 1
        for p in missing:
            self._generation[p] = next(_generations)
        for p in pages:
            self._pinned[p] = True
        return tuple(self._generation[p] for p in pages)

    def unpin(self, addr, size):
        """Real: lets the slot's pages be evicted again. Same here."""
        for p in self._pages(addr, size):
            self._pinned[p] = False

    def loaded_size(self):
        """Real: bytes of this vbar now backed by VRAM. Same here (whole pages)."""
        return sum(self._page_bytes(p) for p, gen in enumerate(self._generation) if gen)

    def free_memory(self, size_bytes):
        """Real: evicts up to `size_bytes` of this vbar's unpinned pages, returns
        the bytes freed. Here: from the last page down."""
        freed = 0
        for p in reversed(range(len(self._generation))):
            if freed >= size_bytes:
                break
            if self._generation[p] and not self._pinned[p]:
                freed += self._evict(p)
        return freed

    def get_residency(self):
        """Real: one flag byte per page, bit 0 resident, bit 1 pinned. Same here."""
        return [(1 if gen else 0) | (2 if pin else 0) for gen, pin in zip(self._generation, self._pinned)]

    def _tensor(self, addr, size):
        start = addr - self.base_addr
        if start < 0 or start + size > self.max_size:
            raise ValueError("allocation outside this vbar")
        return self._backing[start:start + size]


def vbar_fault(alloc):
    """Real: fault one (vbar, address, size) allocation: signature or None."""
    vbar, addr, size = alloc
    return vbar.fault(addr, size)


def vbar_unpin(alloc):
    """Real: unpin one allocation (None is ignored)."""
    if alloc is not None:
        vbar, addr, size = alloc
        vbar.unpin(addr, size)


def vbar_signature_compare(a, b):
    """Real: True when two fault signatures are equal, i.e. the pages were not
    evicted in between and the layer's bytes are still resident; False if
    either is None."""
    if a is None or b is None:
        return False
    if len(a) != len(b):
        raise ValueError(f"Signatures of mismatched length {len(a)} != {len(b)}")
    return tuple(a) == tuple(b)


def vbars_reset_watermark_limits():
    """Real: clears the residency watermark limits aimdo keeps per vbar on every
    device (execution.py calls it after each node). Nothing to clear here."""


def vbars_analyze(device=None):
    """Real: how much VRAM aimdo could hand back from vbars on a device (added to
    free memory by ModelPatcher.get_free_memory); 0 when aimdo is not started.
    Here: the unpinned resident bytes of that device's vbars."""
    if not control.devctxs:
        return 0
    device = control.devctxs[0] if device is None else control.get_devctx(device)
    return sum(v._page_bytes(p) for v in list(_vbars) if v.device == device
               for p, gen in enumerate(v._generation) if gen and not v._pinned[p])
