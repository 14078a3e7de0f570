"""Small modules the torch_pins.nn and torch_pins.diffusers tests stream: the
shapes of a transformer (blocks in a ModuleList, a head in a Sequential, a
parameter and a buffer of the root's own), with random weights from a seed."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x)))) * self.scale


class Net(nn.Module):
    """Units at level "block": "" (pos, steps), "embed", "blocks.0".."blocks.{n-1}", "head.0", "head.1"."""

    def __init__(self, d=16, n=3, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(4, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2))
        self.pos = nn.Parameter(torch.randn(d))
        self.register_buffer("steps", torch.arange(3))
        self.order = None  # the blocks to run, in order (None: all, in order)

    def forward(self, x):
        h = self.embed(x) + self.pos + self.steps.sum()
        for i in (self.order if self.order is not None else range(len(self.blocks))):
            h = self.blocks[i](h)
        return self.head(h)


def block_units(n):
    return ["", "embed"] + [f"blocks.{i}" for i in range(n)] + ["head.0", "head.1"]
