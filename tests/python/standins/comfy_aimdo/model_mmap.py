"""Stand-in for comfy_aimdo.model_mmap: the file mapping comfy.utils.load_safetensors
reads safetensors files through when comfy.memory_management.aimdo_enabled."""
import os

import torch


class ModelMMAP:
    def __init__(self, filepath):
        """Real: maps a model file read-only and keeps a handle open for direct
        reads. Here: a private torch.from_file mapping and an os.open handle."""
        self._fd = os.open(os.fspath(filepath), os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        self._map = torch.from_file(os.fspath(filepath), shared=False, size=size, dtype=torch.uint8)

    def get(self):
        """Real: the mapping's address. Same here."""
        return self._map.data_ptr()

    def get_file_handle(self):
        """Real: the open file's handle (a descriptor on Linux). Same here."""
        return self._fd

    def bounce(self):
        """Real: drops the mapping's resident pages so RAM returns to the system
        (ComfyUI bounces mappings it read from, in reset_cast_buffers). Here: no-op."""
        return True

    def __del__(self, _close=os.close):  # os itself may be gone at interpreter exit
        fd = getattr(self, "_fd", None)
        if fd is not None:
            _close(fd)
            self._fd = None
