"""One policy's replay of the demo, in a process of its own (``python
profiling/demo/replay.py SPEC.json``): loads the model files, drops them from
the page cache, then replays the simulator's accesses run by run through
``cast_to_device`` (or plain copies, for the run without pins), measuring each
run. It prints progress as JSON lines on standard output and writes its result
to the path the spec names. The parent (demo.py) builds the spec.

Note [Demo machine]
The demo replays a workflow on a modelled machine (the trace's `machine`, as
pins-sim does) on whatever machine it runs on, which usually has more RAM:
- Device memory: with a GPU, copies go to a buffer of the trace's `vram` on it.
  Without one, that buffer is in host RAM ("emulated"); either way which layers
  stay on the device follows the simulator's expansion rule, whose accesses the
  demo replays (docs/SIMULATOR.md, "The expansion rule").
- RAM as pins sees it: pins reads /proc/meminfo under its `system_root` key.
  The demo points it at a directory of its own whose meminfo says what the
  modelled machine's would: MemTotal = ram, MemAvailable = ram - other_ram -
  the prompt's LoRA bytes - pins' committed bytes (the simulator's
  ModelledProbe, Note [Simulator memory model]). It rewrites the file after
  every pins call. Within a call the file cannot follow the pool (a cast that
  evicts and then checks its budget again), so pins reuses its reading for
  memory_max_age_us (5 ms), moved by its own pool's commits and decommits
  (Note [Memory readings]): exact, as the simulator's model is. With 0 every
  check would read the file and miss the bytes freed earlier in the same call.
  The LoRA bytes change no commit, so when they change the demo waits out the
  reading's age before the next call. The pool, the pins and the copies are
  real. The real machine's free memory, which other processes move by tens of
  MB a second, plays no part, so a run is repeatable.
- The page cache: Note [Demo page cache].

Note [Demo page cache].

Note [Demo page cache]
A machine with more RAM than the modelled one keeps every file in its page
cache, and would read nothing from disk after the first run under any policy.
The modelled machine's page cache holds what RAM the pins leave: ram -
other_ram - LoRA bytes - committed (the simulator's model, Note [Simulator
memory model]). The demo keeps the same LRU over whole weights and drops a
weight's pages from the real page cache when the model evicts it (madvise
MADV_DONTNEED on its mapped pages, then posix_fadvise DONTNEED on its file
range), so the kernel's page cache holds what the modelled one holds and every
other read goes to the disk, where /proc/self/io counts it. The disk bytes are
the kernel's count; the model only decides what stays cached.
"""
import ctypes
import json
import mmap
import os
import sys
import time
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import files

MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def read_bytes() -> Optional[int]:
    """Bytes this process caused to be read from storage (/proc/self/io), or None
    where the kernel does not account them."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux 4.0+); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def resident_bytes(path: str) -> int:
    """Bytes of `path` in the page cache (mincore over a fresh mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return 0
        try:
            pages = (size + files.PAGE - 1) // files.PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                return 0
            return sum(b & 1 for b in vec) * files.PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def file_mappings(path: str) -> List[Tuple[int, int, int]]:
    """(start, end, file offset) of this process's mappings of `path`."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, int(parts[2], 16)))
    return out


def write_meminfo(path: str, total: int, available: int) -> None:
    """A /proc/meminfo with the lines pins reads (csrc/system/sysmem.h), replaced
    whole so that a reader never sees half of it."""
    tmp = path + ".next"
    with open(tmp, "w") as f:
        f.write(f"MemTotal: {total // 1024} kB\nMemFree: {available // 1024} kB\n"
                f"MemAvailable: {available // 1024} kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    os.replace(tmp, path)


class Weight:
    """One layer of a model file: its tensors and where their bytes are."""
    __slots__ = ("key", "tensors", "ranges", "maps", "nbytes")

    def __init__(self, key, tensors, ranges, maps):
        self.key = key
        self.tensors = tensors  # the loaded tensors, in order
        self.ranges = ranges    # (path, begin, end) file byte ranges
        self.maps = maps        # (address, length) page-aligned mapped ranges to unmap on eviction
        self.nbytes = sum(e - b for _, b, e in ranges)

    def drop(self) -> None:
        """Takes the layer's pages out of the page cache (Note [Demo page cache])."""
        for addr, length in self.maps:
            _libc.madvise(addr, length, MADV_DONTNEED)
        for path, b, e in self.ranges:
            files.drop_from_page_cache(path, b, e - b)


class PageCacheModel:
    """LRU over whole weights with the modelled machine's capacity (Note [Demo
    page cache]; profiling/sim/replay.cpp's PageCache)."""

    def __init__(self):
        self.lru: "OrderedDict[str, Weight]" = OrderedDict()  # least recent first
        self.used = 0

    def touch(self, w: Weight) -> bool:
        if w.key not in self.lru:
            return False
        self.lru.move_to_end(w.key)
        return True

    def insert(self, w: Weight, capacity: int) -> None:
        if w.key in self.lru:
            return
        if w.nbytes > capacity:
            w.drop()  # the kernel has read it; the modelled machine could not keep it
            return
        self.lru[w.key] = w
        self.used += w.nbytes
        self.shrink(capacity)

    def shrink(self, capacity: int) -> None:
        while self.used > capacity and self.lru:
            _, w = self.lru.popitem(last=False)
            self.used -= w.nbytes
            w.drop()


def emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
           "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64", "U64": "uint64",
           "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def load(path: str, header: "files.Header") -> dict:
    """The tensors of safetensors file `path`, views of one private read-only
    mapping of it: nothing is read until a tensor's bytes are touched.
    (torch_pins.load_file replaces this once it lands; see the report.)"""
    import torch
    storage = torch.UntypedStorage.from_file(path, shared=False, nbytes=os.path.getsize(path))
    out = {}
    for e in header.tensors:
        dtype = getattr(torch, _DTYPES[e.dtype])
        t = torch.empty(0, dtype=torch.uint8).set_(storage, e.begin, (e.nbytes,))
        out[e.name] = t.view(dtype).view(e.shape)
    return out


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    import torch

    policy = spec["policy"]
    use_pins = policy != "none"
    device = torch.device(spec["device"])
    mach = spec["machine"]
    t_setup = time.perf_counter()
    io_start = read_bytes()

    # Files: load, note where each layer's bytes are, then drop them all.
    weights: Dict[str, Weight] = {}
    loaded: Dict[str, Tuple[files.Header, dict, list]] = {}  # file -> header, tensors, mappings
    for model, m in spec["models"].items():
        for layer, parts in m["layers"].items():
            ts, ranges, mapped = [], [], []
            for path, name in parts:
                if path not in loaded:
                    header = files.read_header(path, m["what"])
                    try:
                        tensors = load(path, header)
                    except Exception as e:  # the loader's own message, with the file named
                        raise files.FileError(f"{files.named(m['what'], path)}: cannot be loaded: {e}") from e
                    loaded[path] = (header, tensors, file_mappings(path))
                header, tensors, maps = loaded[path]
                t, e = tensors[name], header.by_name[name]
                ts.append(t)
                ranges.append((path, e.begin, e.end))
                addr = t.data_ptr()
                for lo, hi, off in maps:  # unmap only pages that are this file's, at this offset
                    if lo <= addr and addr + e.nbytes <= hi and off + (addr - lo) == e.begin:
                        a0 = addr - addr % files.PAGE
                        a1 = -(-(addr + e.nbytes) // files.PAGE) * files.PAGE
                        mapped.append((a0, a1 - a0))
                        break
            weights[f"{model}/{layer}"] = Weight(f"{model}/{layer}", ts, ranges, mapped)
    # LoRA factors live in process RAM (as the simulator models them): read once, here.
    patches: Dict[str, "torch.Tensor"] = {}
    for lora, l in spec["loras"].items():
        src = load(l["file"], files.read_header(l["file"])) if l.get("file") else {}
        gen = torch.Generator().manual_seed(len(patches))
        for key, nbytes in l["tensors"].items():
            if key in src:
                patches[f"lora:{lora}/{key}"] = src[key].clone()
            elif nbytes % 2 == 0:  # a user's trace: the LoRA has no file, its factors are made in RAM
                patches[f"lora:{lora}/{key}"] = torch.randn(nbytes // 2, generator=gen).half()
            else:
                patches[f"lora:{lora}/{key}"] = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    for w in weights.values():
        w.drop()
    for path in loaded:
        files.drop_from_page_cache(path)
    cached_after_drop = sum(resident_bytes(path) for path in loaded)

    # Device memory (Note [Demo machine]): copies land in a buffer of `vram` bytes, in turn.
    vram = int(mach["vram"])
    arena = torch.empty(vram, dtype=torch.uint8, device=device)
    if device.type == "cpu":
        arena.fill_(0)  # resident now, so the buffer does not grow during the runs
    cursor = [0]

    def destination(t: "torch.Tensor") -> "torch.Tensor":
        n = t.numel() * t.element_size()
        if n > vram:
            return torch.empty_like(t, device=device)
        start = cursor[0] if cursor[0] + n <= vram else 0
        cursor[0] = -(-(start + n) // 512) * 512
        return arena[start:start + n].view(t.dtype).view(t.shape)

    other_ram = int(mach["other_ram"])
    ram = int(mach["ram"])
    ids: Dict[str, int] = {}
    if use_pins:
        meminfo = os.path.join(spec["system_root"], "proc", "meminfo")
        os.makedirs(os.path.dirname(meminfo), exist_ok=True)
        write_meminfo(meminfo, ram, ram - other_ram)  # before pins' runtime starts and reads it
        import torch_pins as pins
        for model in spec["model_order"]:  # the trace's order, as pins-sim registers them
            ids[model] = pins.register_model(model, device)
    last = [pins.stats() if use_pins else {}]

    def committed() -> int:
        return last[0]["committed_bytes"] if use_pins else 0

    def show_memory(lora_bytes: int) -> None:
        """After a pins call: reads its counters and writes what the modelled
        machine's /proc/meminfo would say now (Note [Demo machine])."""
        if not use_pins:
            return
        last[0] = pins.stats()
        write_meminfo(meminfo, ram, max(0, ram - other_ram - lora_bytes - committed()))

    # Every code path of a run once, on tensors of no file, before anything is
    # measured: what the first call faults in from disk (pages of torch's and
    # pins' libraries, kernels of each dtype, lazily imported modules) would
    # otherwise count as run 1's reads.
    dtypes = {t.dtype for w in weights.values() for t in w.tensors} | {t.dtype for t in patches.values()}
    for dtype in dtypes:
        probe = torch.zeros(1024, dtype=dtype)
        destination(probe).copy_(probe)
        if use_pins:
            pins.cast_to_device(probe, device, out=destination(probe))
            pins.cast_many_to_device([probe, probe], device)
    show_memory(0)
    cache = PageCacheModel()
    setup_s = time.perf_counter() - t_setup
    setup_read = (read_bytes() - io_start) if io_start is not None else None
    emit(ev="ready", setup_s=setup_s, cached_after_drop=cached_after_drop)

    results = []
    rss_reset = True
    last_lora_bytes = 0
    for run in spec["runs"]:
        lora_bytes = int(run["lora_bytes"])
        capacity = lambda: max(0, ram - other_ram - lora_bytes - committed())
        total = sum(a[1] for s in run["steps"] for a in s["accesses"])
        done = 0
        hits = misses = fills = plain = 0
        model_bytes_read = 0  # what the page cache model says comes from disk
        page_cache_hit_bytes = 0
        early_read_bytes = 0  # see below
        last_emit = time.perf_counter()
        rss_reset = reset_peak_rss() and rss_reset
        io0 = read_bytes()
        evicted0 = last[0].get("evicted_bytes", 0)
        t0 = time.perf_counter()
        show_memory(lora_bytes)
        if use_pins and lora_bytes != last_lora_bytes:
            # Note [Demo machine]: the reading pins holds predates the LoRA's bytes.
            time.sleep(spec["reading_age_us"] / 1e6 + 0.001)
        last_lora_bytes = lora_bytes
        cache.shrink(capacity())
        if use_pins:
            pins.mark_prompt([ids[m] for m in run["models"]])
            show_memory(lora_bytes)
        for step in run["steps"]:
            mid = ids.get(step["model"], -1)
            if use_pins:
                pins.set_active(mid, True)
                show_memory(lora_bytes)
            for key, nbytes, kind, resident, signature in step["accesses"]:
                now = time.perf_counter()
                if kind == "patches":
                    srcs, w = [patches[key]], None
                else:
                    w = weights[key]
                    srcs = w.tensors
                through_pins = use_pins and not (policy == "lru" and resident)
                if through_pins:
                    before = last[0]
                    if len(srcs) == 1:
                        pins.cast_to_device(srcs[0], device, model=mid, kind=kind, resident=bool(resident),
                                            signature=signature, out=destination(srcs[0]))
                    else:  # a layer of several tensors: one pin, one transfer
                        pins.cast_many_to_device(srcs, device, model=mid, kind=kind, resident=bool(resident),
                                                 signature=signature)
                    show_memory(lora_bytes)
                    after = last[0]
                    hit = after["hits"] > before["hits"]
                    filled = (after["misses"] - before["misses"]) > (after["bypassed"] - before["bypassed"])
                else:
                    for s in srcs:
                        destination(s).copy_(s)
                    hit, filled = False, False
                    plain += 1
                if hit:
                    hits += 1
                else:
                    misses += 1
                    fills += filled
                    if w is not None:  # a weight's bytes came through the page cache
                        was_cached = w.key in cache.lru
                        if filled:  # the pin's commit takes RAM from the page cache
                            cache.shrink(capacity())
                        if cache.touch(w):
                            page_cache_hit_bytes += w.nbytes
                        elif was_cached:
                            # On the modelled machine the pin's commit pushed this layer out
                            # of the page cache before pins read it (the simulator's order);
                            # here pins read it from the page cache a moment before.
                            early_read_bytes += w.nbytes
                        else:
                            model_bytes_read += w.nbytes
                            cache.insert(w, capacity())
                done += nbytes
                if now - last_emit > 0.2:
                    emit(ev="progress", run=run["run"], done=done, total=total)
                    last_emit = now
            if use_pins:
                pins.set_active(mid, False)
                show_memory(lora_bytes)
        if use_pins:
            pins.end_prompt()
            show_memory(lora_bytes)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
        io1 = read_bytes()
        st = last[0]
        r = {"run": run["run"], "prompt": run["prompt"], "wall_s": wall,
             "disk_bytes": (io1 - io0) if io0 is not None and io1 is not None else None,
             "model_disk_bytes": model_bytes_read, "page_cache_hit_bytes": page_cache_hit_bytes,
             "early_read_bytes": early_read_bytes,
             "hits": hits, "misses": misses, "pin_fills": fills, "plain_copies": plain,
             "copied_bytes": total, "peak_rss_bytes": peak_rss(),
             "pinned_bytes": st.get("pinned_bytes", 0), "committed_bytes": st.get("committed_bytes", 0),
             "evicted_bytes": st.get("evicted_bytes", 0) - evicted0}
        results.append(r)
        emit(ev="run", **r)
    out = {"policy": policy, "device": str(device), "setup_s": setup_s, "setup_read_bytes": setup_read,
           "cached_after_drop_bytes": cached_after_drop, "peak_rss_per_run": rss_reset,
           "runs": results}
    if use_pins:
        out["stats"] = {k: v for k, v in pins.stats().items() if not k.startswith("model.")}
    with open(spec["result"], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: replay.py SPEC.json (demo.py writes the spec and runs this)", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
