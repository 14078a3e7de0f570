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
  evicts, gives idle memory back and then checks its budget again), so pins
  reuses its reading for memory_max_age_us, moved by its own pool's commits
  and decommits (Note [Memory readings]): exact, as the simulator's model is.
  The demo sets the longest age pins takes (1 s, DEMO_READING_AGE_US), longer
  than any call: with the library's 5 ms a call that filled a layer from disk
  outlived its reading, read the file again mid-call and missed what the call
  had freed, which moved an eviction now and then (mru's run 2 of the default
  demo read 3 MiB less than predicted in one run; trace's runs 4, 6, 7 and 8
  up to 0.05 GiB off in another). With 0 every check would read the file. The
  LoRA bytes change no commit, so when they change the demo waits out the
  reading's age before the next call. The pool, the pins and the copies are
  real. The real machine's free memory, which other processes move by tens of
  MB a second, plays no part, so a run is repeatable.
- The page cache: Note [Demo page cache].

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
the kernel's count; the model only decides what stays cached. The runs with
pins load their files with ``torch_pins.load_file``, as an application that
uses pins would: a new pin of a weight is filled from the page cache when it
holds the layer (which then drops it) and otherwise from the disk past the
cache, so a pinned layer is held once (Note [File-backed pins] in
csrc/files/mapped.h); the model takes the layer out of its LRU likewise
(pins-sim's default; ``--buffered-fills`` there models a loader's mapping).
The run without pins maps the files itself.
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
# How a replay says that a file or directory failed it (demo.py passes the line on as its own error):
# exit status FILE_ERROR, its last line on standard error FILE_ERROR_PREFIX and the message.
FILE_ERROR = 2
FILE_ERROR_PREFIX = "replay: "
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
    text = (f"MemTotal: {total // 1024} kB\nMemFree: {available // 1024} kB\n"
            f"MemAvailable: {available // 1024} kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n").encode()
    try:
        files.write_atomic(path, lambda f: f.write(text))
    except OSError as e:
        raise files.failed(f"cannot write the modelled meminfo {path!r}", e) from None


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

    def take(self, w: Weight) -> bool:
        """Takes `w` out, as a pin filled from the page cache drops it there; whether it was in."""
        if w.key not in self.lru:
            return False
        del self.lru[w.key]
        self.used -= w.nbytes
        w.drop()  # pins dropped the pages it read; this drops the ones the mapping holds too
        return True

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


def load(path: str, header: "files.Header", pins=None) -> dict:
    """The tensors of safetensors file `path`, views of one private mapping of
    it: nothing is read until a tensor's bytes are touched. With `pins`, its
    load_file maps it (Note [Demo page cache])."""
    if pins is not None:
        return pins.load_file(path)
    import torch
    storage = torch.UntypedStorage.from_file(path, shared=False, nbytes=os.path.getsize(path))
    out = {}
    for e in header.tensors:
        dtype = getattr(torch, _DTYPES[e.dtype])
        t = torch.empty(0, dtype=torch.uint8).set_(storage, e.begin, (e.nbytes,))
        out[e.name] = t.view(dtype).view(e.shape)
    return out


def _open(path: str, what: str, loaded: dict, pins=None) -> Tuple["files.Header", dict, list]:
    """File `path`'s header, tensors and mappings, loaded on its first use."""
    if path not in loaded:
        header = files.read_header(path, what)
        try:
            tensors = load(path, header, pins)
        except Exception as e:  # the loader's own message, with the file named
            raise files.FileError(f"{files.named(what, path)}: cannot be loaded: {e}") from e
        loaded[path] = (header, tensors, file_mappings(path))
    return loaded[path]


def _mapped_pages(addr: int, entry: "files.TensorEntry", maps: List[Tuple[int, int, int]]
                  ) -> Optional[Tuple[int, int]]:
    """(address, length) of the pages that hold a tensor's bytes at `addr`, when
    a mapping of its file at that offset holds them: only such pages are
    unmapped on eviction, never another file's."""
    for lo, hi, off in maps:
        if lo <= addr and addr + entry.nbytes <= hi and off + (addr - lo) == entry.begin:
            a0 = addr - addr % files.PAGE
            a1 = -(-(addr + entry.nbytes) // files.PAGE) * files.PAGE
            return a0, a1 - a0
    return None


def load_weights(models: dict, pins=None) -> Tuple[Dict[str, Weight], Dict[str, tuple]]:
    """Every layer of the spec's models ({"model/layer": Weight}) and the files
    loaded for them (path -> header, tensors, mappings), by `pins`' load_file
    when given."""
    weights: Dict[str, Weight] = {}
    loaded: Dict[str, Tuple[files.Header, dict, list]] = {}
    for model, m in models.items():
        for layer, parts in m["layers"].items():
            ts, ranges, mapped = [], [], []
            for path, name in parts:
                header, tensors, maps = _open(path, m["what"], loaded, pins)
                t, e = tensors[name], header.by_name[name]
                ts.append(t)
                ranges.append((path, e.begin, e.end))
                pages = _mapped_pages(t.data_ptr(), e, maps)
                if pages:
                    mapped.append(pages)
            weights[f"{model}/{layer}"] = Weight(f"{model}/{layer}", ts, ranges, mapped)
    return weights, loaded


def load_patches(loras: dict) -> Dict[str, "torch.Tensor"]:
    """The LoRA factors, in process RAM (as the simulator models them): read once, here."""
    import torch
    patches: Dict[str, "torch.Tensor"] = {}
    for lora, l in loras.items():
        src = load(l["file"], files.read_header(l["file"])) if l.get("file") else {}
        gen = torch.Generator().manual_seed(len(patches))
        for key, nbytes in l["tensors"].items():
            if key in src:
                patches[f"lora:{lora}/{key}"] = src[key].clone()
            elif nbytes % 2 == 0:  # a user's trace: the LoRA has no file, its factors are made in RAM
                patches[f"lora:{lora}/{key}"] = torch.randn(nbytes // 2, generator=gen).half()
            else:
                patches[f"lora:{lora}/{key}"] = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    return patches


def drop_files(weights: Dict[str, Weight], loaded: dict) -> int:
    """Drops every loaded file from the page cache; returns the bytes that stayed there."""
    for w in weights.values():
        w.drop()
    for path in loaded:
        files.drop_from_page_cache(path)
    return sum(resident_bytes(path) for path in loaded)


class DeviceArena:
    """Device memory (Note [Demo machine]): copies land in a buffer of `vram` bytes, in turn."""

    def __init__(self, vram: int, device):
        import torch
        self.vram, self.device, self.cursor = vram, device, 0
        self.buffer = torch.empty(vram, dtype=torch.uint8, device=device)
        if device.type == "cpu":
            self.buffer.fill_(0)  # resident now, so the buffer does not grow during the runs

    def destination(self, t: "torch.Tensor") -> "torch.Tensor":
        import torch
        n = t.numel() * t.element_size()
        if n > self.vram:
            return torch.empty_like(t, device=self.device)
        start = self.cursor if self.cursor + n <= self.vram else 0
        self.cursor = -(-(start + n) // 512) * 512
        return self.buffer[start:start + n].view(t.dtype).view(t.shape)


class ModelledMemory:
    """The modelled machine's RAM as the replay's pins sees it (Note [Demo
    machine]) and pins' latest counters; `pins` is None for the run without pins."""

    def __init__(self, spec: dict, device):
        self.ram, self.other_ram = int(spec["machine"]["ram"]), int(spec["machine"]["other_ram"])
        self.pins = None
        self.ids: Dict[str, int] = {}
        self.stats: dict = {}
        if spec["policy"] == "none":
            return
        self.meminfo = os.path.join(spec["system_root"], "proc", "meminfo")
        os.makedirs(os.path.dirname(self.meminfo), exist_ok=True)
        write_meminfo(self.meminfo, self.ram, self.ram - self.other_ram)  # before pins' runtime starts and reads it
        import torch_pins as pins
        self.pins = pins
        for model in spec["model_order"]:  # the trace's order, as pins-sim registers them
            self.ids[model] = pins.register_model(model, device)
        self.stats = pins.stats()

    def committed(self) -> int:
        return self.stats["committed_bytes"] if self.pins else 0

    def available(self, lora_bytes: int) -> int:
        """MemAvailable of the modelled machine, which is also what its page cache can hold."""
        return max(0, self.ram - self.other_ram - lora_bytes - self.committed())

    def show(self, lora_bytes: int) -> None:
        """After a pins call: reads its counters and writes what the modelled
        machine's /proc/meminfo would say now."""
        if self.pins is None:
            return
        self.stats = self.pins.stats()
        write_meminfo(self.meminfo, self.ram, self.available(lora_bytes))


def warm_up(weights: Dict[str, Weight], patches: Dict[str, "torch.Tensor"], arena: DeviceArena,
            memory: ModelledMemory, device) -> None:
    """Every code path of a run once, on tensors of no file, before anything is
    measured: what the first call faults in from disk (pages of torch's and
    pins' libraries, kernels of each dtype, lazily imported modules) would
    otherwise count as run 1's reads."""
    import torch
    dtypes = {t.dtype for w in weights.values() for t in w.tensors} | {t.dtype for t in patches.values()}
    for dtype in dtypes:
        probe = torch.zeros(1024, dtype=dtype)
        arena.destination(probe).copy_(probe)
        if memory.pins:
            memory.pins.cast_to_device(probe, device, out=arena.destination(probe))
            memory.pins.cast_many_to_device([probe, probe], device)
    memory.show(0)


class RunCounts:
    """What one run has measured so far."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self.hits = self.misses = self.fills = self.plain = 0
        self.model_bytes_read = 0  # what the page cache model says comes from disk
        self.page_cache_hit_bytes = 0
        self.early_read_bytes = 0  # Replay.through_page_cache
        self.last_emit = time.perf_counter()


class Replay:
    """One policy's runs, access by access, on the loaded weights."""

    def __init__(self, spec: dict, device, weights: Dict[str, Weight], patches: Dict[str, "torch.Tensor"],
                 arena: DeviceArena, memory: ModelledMemory):
        self.policy, self.reading_age_us = spec["policy"], spec["reading_age_us"]
        self.device, self.weights, self.patches, self.arena, self.memory = device, weights, patches, arena, memory
        self.pins = memory.pins
        self.cache = PageCacheModel()
        self.rss_reset = True  # VmHWM could be reset before every run: peak RSS is per run
        self.last_lora_bytes = 0

    def run(self, run: dict) -> dict:
        """Replays one run and measures it; emits and returns its result."""
        lora_bytes = int(run["lora_bytes"])
        counts = RunCounts(sum(a[1] for s in run["steps"] for a in s["accesses"]))
        self.rss_reset = reset_peak_rss() and self.rss_reset
        io0 = read_bytes()
        evicted0 = self.memory.stats.get("evicted_bytes", 0)
        t0 = time.perf_counter()
        self.begin_prompt(run["models"], lora_bytes)
        for step in run["steps"]:
            self.step(run["run"], step, lora_bytes, counts)
        if self.pins:
            self.pins.end_prompt()
            self.memory.show(lora_bytes)
        if self.device.type == "cuda":
            import torch
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - t0
        io1 = read_bytes()
        st = self.memory.stats
        r = {"run": run["run"], "prompt": run["prompt"], "wall_s": wall,
             "disk_bytes": (io1 - io0) if io0 is not None and io1 is not None else None,
             "model_disk_bytes": counts.model_bytes_read, "page_cache_hit_bytes": counts.page_cache_hit_bytes,
             "early_read_bytes": counts.early_read_bytes,
             "hits": counts.hits, "misses": counts.misses, "pin_fills": counts.fills, "plain_copies": counts.plain,
             "copied_bytes": counts.total, "peak_rss_bytes": peak_rss(),
             "pinned_bytes": st.get("pinned_bytes", 0), "committed_bytes": st.get("committed_bytes", 0),
             "evicted_bytes": st.get("evicted_bytes", 0) - evicted0}
        emit(ev="run", **r)
        return r

    def begin_prompt(self, models: List[str], lora_bytes: int) -> None:
        self.memory.show(lora_bytes)
        if self.pins and lora_bytes != self.last_lora_bytes:
            # Note [Demo machine]: the reading pins holds predates the LoRA's bytes.
            time.sleep(self.reading_age_us / 1e6 + 0.001)
        self.last_lora_bytes = lora_bytes
        self.cache.shrink(self.memory.available(lora_bytes))
        if self.pins:
            self.pins.mark_prompt([self.memory.ids[m] for m in models])
            self.memory.show(lora_bytes)

    def step(self, run_no: int, step: dict, lora_bytes: int, counts: RunCounts) -> None:
        mid = self.memory.ids.get(step["model"], -1)
        if self.pins:
            self.pins.set_active(mid, True)
            self.memory.show(lora_bytes)
        for access in step["accesses"]:
            self.access(run_no, mid, access, lora_bytes, counts)
        if self.pins:
            self.pins.set_active(mid, False)
            self.memory.show(lora_bytes)

    def access(self, run_no: int, mid: int, access: list, lora_bytes: int, counts: RunCounts) -> None:
        """One access of the simulator's: through pins, or a plain copy for the
        run without pins and for lru's device-resident layers."""
        key, nbytes, kind, resident, signature = access
        now = time.perf_counter()
        if kind == "patches":
            srcs, w = [self.patches[key]], None
        else:
            w = self.weights[key]
            srcs = w.tensors
        if self.pins and not (self.policy == "lru" and resident):
            hit, filled = self.cast(srcs, mid, kind, bool(resident), signature, lora_bytes)
        else:
            for s in srcs:
                self.arena.destination(s).copy_(s)
            hit, filled = False, False
            counts.plain += 1
        if hit:
            counts.hits += 1
        else:
            counts.misses += 1
            counts.fills += filled
            if w is not None:  # a weight's bytes came through the page cache
                self.through_page_cache(w, filled, lora_bytes, counts)
        counts.done += nbytes
        if now - counts.last_emit > 0.2:
            emit(ev="progress", run=run_no, done=counts.done, total=counts.total)
            counts.last_emit = now

    def cast(self, srcs: list, mid: int, kind: str, resident: bool, signature, lora_bytes: int) -> Tuple[bool, bool]:
        """Casts a layer through pins; whether it hit a pin, and whether a miss filled one."""
        before = self.memory.stats
        if len(srcs) == 1:
            self.pins.cast_to_device(srcs[0], self.device, model=mid, kind=kind, resident=resident,
                                     signature=signature, out=self.arena.destination(srcs[0]))
        else:  # a layer of several tensors: one pin, one transfer
            self.pins.cast_many_to_device(srcs, self.device, model=mid, kind=kind, resident=resident,
                                          signature=signature)
        self.memory.show(lora_bytes)
        after = self.memory.stats
        hit = after["hits"] > before["hits"]
        filled = (after["misses"] - before["misses"]) > (after["bypassed"] - before["bypassed"])
        return hit, filled

    def through_page_cache(self, w: Weight, filled: bool, lora_bytes: int, counts: RunCounts) -> None:
        """Where a missed weight's bytes came from on the modelled machine: its page cache or the disk."""
        was_cached = w.key in self.cache.lru
        if filled:  # the pin's commit takes RAM from the page cache
            self.cache.shrink(self.memory.available(lora_bytes))
        if filled and self.cache.take(w):  # Note [Demo page cache]: the pin took the layer from the cache
            counts.page_cache_hit_bytes += w.nbytes
        elif filled and not was_cached:  # read from the disk past the cache
            counts.model_bytes_read += w.nbytes
        elif filled:
            counts.early_read_bytes += w.nbytes  # as below: the real pin read it a moment before the commit
        elif self.cache.touch(w):
            counts.page_cache_hit_bytes += w.nbytes
        elif was_cached:
            # On the modelled machine the pin's commit pushed this layer out
            # of the page cache before pins read it (the simulator's order);
            # here pins read it from the page cache a moment before.
            counts.early_read_bytes += w.nbytes
        else:
            counts.model_bytes_read += w.nbytes
            self.cache.insert(w, self.memory.available(lora_bytes))


def write_result(spec: dict, device, setup: dict, replay: Replay, results: List[dict]) -> None:
    """The policy's result, where the spec says (demo.py reads it when this process has exited)."""
    out = {"policy": spec["policy"], "device": str(device), **setup, "peak_rss_per_run": replay.rss_reset,
           "runs": results}
    if replay.pins:
        out["stats"] = {k: v for k, v in replay.pins.stats().items() if not k.startswith("model.")}
    text = json.dumps(out, indent=1).encode()
    try:
        files.write_atomic(spec["result"], lambda f: f.write(text))
    except OSError as e:
        raise files.failed(f"cannot write the replay's result {spec['result']!r}", e) from None


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    import torch

    device = torch.device(spec["device"])
    t_setup = time.perf_counter()
    io_start = read_bytes()
    memory = ModelledMemory(spec, device)  # pins' meminfo first: its runtime reads it on its first call
    # Note [Demo page cache]: the runs with pins load through load_file.
    weights, loaded = load_weights(spec["models"], memory.pins)
    patches = load_patches(spec["loras"])
    cached_after_drop = drop_files(weights, loaded)
    arena = DeviceArena(int(spec["machine"]["vram"]), device)
    warm_up(weights, patches, arena, memory, device)
    replay = Replay(spec, device, weights, patches, arena, memory)
    setup_s = time.perf_counter() - t_setup
    setup_read = (read_bytes() - io_start) if io_start is not None else None
    emit(ev="ready", setup_s=setup_s, cached_after_drop=cached_after_drop)

    results = [replay.run(run) for run in spec["runs"]]
    write_result(spec, device, {"setup_s": setup_s, "setup_read_bytes": setup_read,
                                "cached_after_drop_bytes": cached_after_drop}, replay, results)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: replay.py SPEC.json (demo.py writes the spec and runs this)", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(sys.argv[1]))
    except (files.FileError, OSError) as e:  # a file gone or unwritable: one line, no traceback
        message = str(e if isinstance(e, files.FileError) else files.failed(None, e))
        print(FILE_ERROR_PREFIX + " ".join(message.splitlines()), file=sys.stderr)
        sys.exit(FILE_ERROR)
