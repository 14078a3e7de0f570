"""The TorchScript module that the C++ app (examples/cpp_app) loads and runs:
its one buffer goes through pins' cast op on every forward. Scripting it needs
the pins library loaded first (import torch_pins), so that the op resolves.

A module of its own, not a fixture in conftest.py: test_install.py scripts it
with the other venv's Python, which has no pytest."""
import torch


class Caster(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.arange(16 * 8, dtype=torch.float32).reshape(16, 8) / 7)

    def forward(self, x: torch.Tensor, model: int) -> torch.Tensor:
        w = torch.ops.pins.cast_to_device(self.w, x.device, x.dtype, False, model, "weights", False, None)
        return x @ w
