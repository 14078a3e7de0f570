"""Stand-in for comfy_aimdo.vram_buffer: the cast scratch buffer ComfyUI's
get_aimdo_cast_buffer makes per offload stream (only when there is a CUDA/XPU
offload stream, so never on a CPU-only run)."""
import weakref

import torch

from . import control

_buffers = weakref.WeakSet()


def _allocated_bytes():
    return sum(b.size() for b in list(_buffers))


class VRAMBuffer:
    def __init__(self, max_size, device):
        """Real: reserves `max_size` bytes of VRAM address space on a GPU, backed
        on demand in 16 MiB chunks. Here: a CPU tensor, grown on demand."""
        self._devctx = control.get_devctx(device)
        self.device = device
        self.max_size = int(max_size)
        self._chunk_size = 16 << 20
        self._allocated = 0
        self._backing = torch.empty(0, dtype=torch.uint8)
        self.base_addr = self._backing.data_ptr()
        _buffers.add(self)

    def size(self):
        """Real: bytes backed so far. Same here."""
        return self._allocated

    def get(self, size, offset=0):
        """Real: (buffer, address, size) of [offset, offset+size), growing the
        backing in place. Here growth moves the buffer (earlier views keep the
        old memory); ComfyUI makes each get() a tensor at once, so it does not show."""
        required = int(size) + int(offset)
        if required > self._allocated:
            if required > self.max_size:
                raise RuntimeError(f"VRAM grow failed: {required} bytes")
            grown = (required + self._chunk_size - 1) // self._chunk_size * self._chunk_size
            backing = torch.empty(grown, dtype=torch.uint8)
            backing[:self._allocated].copy_(self._backing[:self._allocated])
            self._backing, self._allocated = backing, grown
            self.base_addr = backing.data_ptr()
        return (self, self.base_addr + int(offset), int(size))

    def _tensor(self, addr, size):
        start = addr - self.base_addr
        if start < 0 or start + size > self._allocated:
            raise ValueError("stale or foreign VRAMBuffer allocation")
        return self._backing[start:start + size]
