"""Stands in for ComfyUI-GGUF's ops.py: ``GGMLTensor`` (a plain tensor subclass
over a GGUF file's raw bytes, ``tensor_type`` and ``tensor_shape`` as
attributes, a ``.to`` that carries them and copies the patch list, ``shape``
answering the logical shape, ``detach`` returning itself) and ``GGMLLayer``,
whose ``cast_bias_weight`` moves the bias, then the weight, with their own
``.to(device)`` and dequantizes them; an unquantized layer takes ComfyUI's
cast path (the stand-in comfy.ops)."""
import torch

import comfy.ops

from .dequant import dequantize_tensor, is_quantized


class GGMLTensor(torch.Tensor):
    def __new__(cls, *args, tensor_type, tensor_shape, patches=(), **kwargs):
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, tensor_type, tensor_shape, patches=(), **kwargs):
        super().__init__()
        self.tensor_type, self.tensor_shape, self.patches = tensor_type, tensor_shape, list(patches)

    def to(self, *args, **kwargs):
        new = super().to(*args, **kwargs)
        new.tensor_type = getattr(self, "tensor_type", None)
        new.tensor_shape = getattr(self, "tensor_shape", new.data.shape)
        new.patches = list(getattr(self, "patches", []))
        return new

    def detach(self, *args, **kwargs):
        return self

    @property
    def shape(self):
        if not hasattr(self, "tensor_shape"):
            self.tensor_shape = self.size()
        return self.tensor_shape


class GGMLLayer(torch.nn.Module):
    def is_ggml_quantized(self):
        return is_quantized(self.weight) or is_quantized(self.bias)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for name in ("weight", "bias"):
            if prefix + name in state_dict:
                setattr(self, name, torch.nn.Parameter(state_dict[prefix + name], requires_grad=False))

    def get_weight(self, tensor, dtype):
        return dequantize_tensor(tensor, dtype) if tensor is not None else None

    def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None):
        if input is not None:
            dtype = input.dtype if dtype is None else dtype
            device = input.device if device is None else device
        bias = s.get_weight(s.bias.to(device), dtype) if s.bias is not None else None
        weight = s.get_weight(s.weight.to(device), dtype)
        return weight, bias


class Linear(GGMLLayer, comfy.ops.Linear):
    def __init__(self, in_features, out_features, bias=True):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight, self.bias = None, None

    def forward(self, x):
        if self.is_ggml_quantized():
            weight, bias = self.cast_bias_weight(x)
            return torch.nn.functional.linear(x, weight, bias)
        return super().forward(x)
