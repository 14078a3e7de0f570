"""Stand-in for comfy_aimdo.torch: aimdo memory as torch tensors."""


def aimdo_to_tensor(alloc, device):
    """Real: a uint8 tensor on `device` over a (vbar or VRAMBuffer, address,
    size) allocation's VRAM. Here: the CPU view of the stand-in's memory,
    whatever `device` says (the stand-in has no other memory)."""
    owner, addr, size = alloc
    return owner._tensor(addr, size)


def hostbuf_to_tensor(hostbuf):
    """Real: a uint8 CPU tensor over a HostBuffer's first `size` bytes. Same here."""
    return hostbuf._backing[:hostbuf.size]
