"""Stand-in for comfy_aimdo.host_buffer: growable host RAM that ComfyUI's
dynamic loader pins layer by layer (comfy.pinned_memory), and file reads into it."""
import ctypes
import os

import torch


def _file_handle(file_obj):
    return file_obj if isinstance(file_obj, int) else file_obj.fileno()


def _pread_into(fd, address, file_offset, size):
    view = (ctypes.c_ubyte * size).from_address(address)
    done = 0
    while done < size:
        n = os.preadv(fd, [memoryview(view)[done:]], file_offset + done)
        if n <= 0:
            raise RuntimeError("short read")
        done += n


def read_file_to_device(file_obj, file_offset, size, stream, device_ptr, device, mark_cold=True):
    """Real: reads a file range straight into VRAM at `device_ptr` (ComfyUI uses
    it only for a non-CPU destination). Here "device" memory is CPU memory."""
    _pread_into(_file_handle(file_obj), int(device_ptr), int(file_offset), int(size))


class HostBuffer:
    def __init__(self, size, prewarm=0, max_grow_size=0, mark_cold=True):
        """Real: reserves max(size, max_grow_size) bytes of host memory that
        grows in place (prewarming some pages) and starts `size` bytes long.
        Here: an untouched CPU tensor of that capacity."""
        self.capacity = max(int(size), int(max_grow_size))
        self.prewarm = max(0, int(prewarm))
        self._backing = torch.empty(self.capacity, dtype=torch.uint8)
        self.size = 0
        if size:
            self.extend(size)

    def get_raw_address(self):
        """Real: the buffer's host address. Same here."""
        return self._backing.data_ptr() if self.capacity else 0

    def extend(self, size, reallocate=False, register=True):
        """Real: grows the buffer by `size` bytes (optionally registering them
        with CUDA), returns the new part's address; RuntimeError past its
        reservation. Same here, without registration."""
        size = int(size)
        if self.size + size > self.capacity:
            raise RuntimeError("HostBuffer.extend failed")
        address = self.get_raw_address() + self.size
        self.size += size
        return address

    def truncate(self, size, do_unregister=True):
        """Real: shrinks the buffer to `size` bytes (unregistering the rest).
        Same here, without registration."""
        self.size = int(size)

    def read_file_slice(self, file_obj, file_offset, size, offset=0, stream=0, device_ptr=0, device=-1):
        """Real: reads a file range into the buffer at `offset` and, given a
        device pointer, on into VRAM too. Here both are CPU memory."""
        size, offset = int(size), int(offset)
        if offset + size > self.capacity:
            raise RuntimeError("HostBuffer.read_file_slice failed")
        _pread_into(_file_handle(file_obj), self.get_raw_address() + offset, int(file_offset), size)
        if device_ptr:
            ctypes.memmove(int(device_ptr), self.get_raw_address() + offset, size)
        self.size = max(self.size, offset + size)
