"""Stands in for ComfyUI-GGUF's loader.py: a GGUF file's tensors as GGMLTensors
over the file's mapping (F16/F32 ones in their shape, quantized ones as their
raw rows of bytes), by name."""
import warnings

import gguf
import torch

from .ops import GGMLTensor


def gguf_sd_loader(path):
    reader = gguf.GGUFReader(path)
    sd = {}
    for tensor in reader.tensors:
        shape = torch.Size(int(v) for v in reversed(tensor.shape))
        with warnings.catch_warnings():  # the mapping is read-only; nothing writes it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            data = torch.from_numpy(tensor.data)
        if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = data.view(*shape)
        sd[tensor.name] = GGMLTensor(data, tensor_type=tensor.tensor_type, tensor_shape=shape)
    return sd
