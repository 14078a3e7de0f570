"""The stand-in's dequantization: the gguf package's own reference code."""
import gguf
import torch

TORCH_COMPATIBLE = (None, gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


def is_quantized(t):
    return t is not None and getattr(t, "tensor_type", None) not in TORCH_COMPATIBLE


def dequantize_tensor(t, dtype):
    """The values of a GGMLTensor in its logical shape, as a plain tensor of ``dtype``."""
    raw = t.as_subclass(torch.Tensor)
    if not is_quantized(t):
        return raw.to(dtype)
    values = gguf.quants.dequantize(raw.cpu().numpy(), t.tensor_type)
    return torch.from_numpy(values).reshape(t.tensor_shape).to(device=t.device, dtype=dtype)
