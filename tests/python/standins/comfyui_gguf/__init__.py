"""Stands in for ComfyUI-GGUF (city96/ComfyUI-GGUF), a ComfyUI custom node, in
the stand-in tests (tests/python/test_comfy_standins.py): our own code, written
from its observed interface (README.md beside comfy_aimdo/ says which)."""
from . import loader, ops  # noqa: F401

NODE_CLASS_MAPPINGS = {}
