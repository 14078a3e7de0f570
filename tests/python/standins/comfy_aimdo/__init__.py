"""A CPU stand-in for comfy-aimdo, the "AI Model Dynamic Offloader" that ComfyUI
(0.33, commit 0f1fa67a) imports at module level and drives on its dynamic VRAM
path. Written for pins' tests; not aimdo's code.

"VRAM" here is plain CPU memory (torch uint8 tensors) with an optional byte
limit and a page size (model_vbar.configure), so that ComfyUI's vbar logic
(fault, resident-or-not, pin, evict, free) can run on a machine without a GPU.
Submodules are named as ComfyUI imports them: control, host_buffer,
vram_buffer, model_vbar, torch, model_mmap. See ../README.md.

A regular package (this one has an __init__.py) wins over the real comfy-aimdo,
which is a namespace package, wherever the two sit on sys.path.
"""
STANDIN = True
__version__ = "0.0.0+pins-standin"
