"""pins.load_file (ops/load_file.cpp) and file-backed pins (Note [File-backed pins]
in csrc/files/mapped.h): a safetensors file's tensors as its own reader gives
them, a new pin filled from the file, never from a stale file, and malformed
files refused with the file and the field named."""
import gc
import json
import os
import struct

import pytest
import torch

safetensors_torch = pytest.importorskip("safetensors.torch")


def write_safetensors(path, header: dict, data: bytes) -> str:
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return str(path)


@pytest.fixture
def weights(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "blk.0.w": torch.randn(256, 384, generator=gen).half(),
        "blk.0.b": torch.randn(384, generator=gen),
        "blk.1.w": torch.randn(300, 129, generator=gen).to(torch.bfloat16),  # an odd size: unaligned offsets after it
        "steps": torch.arange(7, dtype=torch.int64),
        "mask": torch.rand(33, generator=gen) > 0.5,
        "fp8": torch.randn(64, 8, generator=gen).to(torch.float8_e4m3fn),
        "empty": torch.empty(0, 5),
    }
    path = str(tmp_path / "model.safetensors")
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    return path, tensors


def test_tensors_equal_safetensors_own_reader(pins, weights):
    path, tensors = weights
    ours = pins.load_file(path)
    theirs = safetensors_torch.load_file(path)
    assert set(ours) == set(theirs) == set(tensors)
    for name, t in ours.items():
        assert t.dtype == theirs[name].dtype and t.shape == theirs[name].shape, name
        assert t.device.type == "cpu" and t.is_contiguous()
        assert torch.equal(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t,
                           theirs[name].view(torch.uint8) if t.dtype == torch.float8_e4m3fn else theirs[name]), name
    # In the order of their bytes in the file.
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    order = sorted((v["data_offsets"], k) for k, v in header.items() if k != "__metadata__")
    assert list(ours) == [k for _, k in order]


def test_a_new_pin_is_filled_from_the_file_bit_exact(pins, model, weights):
    path, tensors = weights
    loaded = pins.load_file(path)
    before = pins.stats()
    for name in ("blk.0.w", "blk.1.w", "steps"):
        out = pins.cast_to_device(loaded[name], "cpu", model=model)
        assert torch.equal(out, tensors[name]), name
    after = pins.stats()
    assert after["file_fills"] - before["file_fills"] == 3
    assert after["file_fill_bytes"] - before["file_fill_bytes"] == sum(
        tensors[n].numel() * tensors[n].element_size() for n in ("blk.0.w", "blk.1.w", "steps"))
    # The second cast is a hit on the pin: no read.
    out = pins.cast_to_device(loaded["blk.1.w"], "cpu", torch.float32, model=model)
    assert torch.equal(out, tensors["blk.1.w"].float())
    assert pins.stats()["file_fills"] == after["file_fills"]
    assert pins.stats()[f"model.{model}.hits"] == 1
    # A layer of several tensors in one pin, each part from its place in the file.
    outs = pins.cast_many_to_device([loaded["blk.0.b"], loaded["mask"]], "cpu", model=model)
    assert torch.equal(outs[0], tensors["blk.0.b"]) and torch.equal(outs[1], tensors["mask"])
    assert pins.stats()["file_fills"] == after["file_fills"] + 2


def _cached_pages(path):
    """Pages of `path` in the page cache (mincore over a fresh shared mapping)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
        assert libc.mincore(addr, size, vec) == 0
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


def test_a_range_the_page_cache_holds_is_read_from_it_and_then_dropped(pins, model, tmp_path):
    # Note [File-backed pins]: O_DIRECT would read the disk again; the cached
    # pages are copied and given back, so the weight is held once, in its pin.
    path = str(tmp_path / "cached.safetensors")
    w = torch.randn(1 << 20, generator=torch.Generator().manual_seed(3))  # 4 MiB: a run of whole pages
    safetensors_torch.save_file({"w": w}, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # written back: the cache may drop its pages
        f.read()  # every page cached
    if _cached_pages(path) * 4096 < os.path.getsize(path):
        pytest.skip("this filesystem does not keep the file in the page cache")
    loaded = pins.load_file(path)
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(loaded["w"], "cpu", model=model), w)
    after = pins.stats()
    assert after["file_fills"] - before["file_fills"] == 1
    assert after["file_fills_cached"] - before["file_fills_cached"] == 1
    assert after["file_fills_direct"] == before["file_fills_direct"]
    assert _cached_pages(path) * 4096 < (1 << 20), "the pinned range left the page cache"
    # Not cached: read from the disk (O_DIRECT where the filesystem allows it), not counted as cached.
    path2 = str(tmp_path / "cold.safetensors")
    safetensors_torch.save_file({"w": w}, path2)
    fd = os.open(path2, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if _cached_pages(path2) > 2:
        pytest.skip("this filesystem keeps the file cached")
    loaded2 = pins.load_file(path2)
    before = pins.stats()
    assert torch.equal(pins.cast_to_device(loaded2["w"], "cpu", model=model), w)
    assert pins.stats()["file_fills_cached"] == before["file_fills_cached"]


def test_a_tensor_written_in_place_is_pinned_from_memory(pins, model, weights):
    path, tensors = weights
    loaded = pins.load_file(path)
    w = loaded["blk.0.w"]
    w[3].add_(1)  # ComfyUI's in-place patch, before the first cast
    before = pins.stats()
    out = pins.cast_to_device(w, "cpu", model=model)
    expected = tensors["blk.0.w"].clone()
    expected[3].add_(1)
    assert torch.equal(out, expected), "the pin served the file's stale bytes"
    after = pins.stats()
    assert after["file_fills_written"] == before["file_fills_written"] + 1
    assert after["file_fills"] == before["file_fills"]
    # The file itself is untouched: the mapping is private.
    assert torch.equal(safetensors_torch.load_file(path)["blk.0.w"], tensors["blk.0.w"])


def test_inference_mode_loads_and_pins_from_the_file(pins, model, weights):
    path, tensors = weights
    with torch.inference_mode():
        loaded = pins.load_file(path)
        assert loaded["blk.0.w"].is_inference()
        before = pins.stats()["file_fills"]
        out = pins.cast_to_device(loaded["blk.0.w"], "cpu", model=model)
    assert torch.equal(out, tensors["blk.0.w"])
    assert pins.stats()["file_fills"] == before + 1


def test_the_mapping_lives_as_long_as_a_tensor(pins, weights):
    path, tensors = weights
    start = pins.stats()["mapped_files"]
    loaded = pins.load_file(path)
    keep = loaded["steps"]
    assert pins.stats()["mapped_files"] == start + 1
    del loaded
    gc.collect()
    assert pins.stats()["mapped_files"] == start + 1, "a tensor still uses the mapping"
    assert torch.equal(keep, tensors["steps"])
    del keep
    gc.collect()
    assert pins.stats()["mapped_files"] == start


def test_a_load_that_fails_leaves_the_mapped_count_as_it_was(pins, tmp_path):
    start = pins.stats()["mapped_files"]
    for path in (str(tmp_path / "missing.safetensors"), str(tmp_path)):
        with pytest.raises((RuntimeError, ValueError)):
            pins.load_file(path)
        assert pins.stats()["mapped_files"] == start, path


def test_torchscript_calls_the_op(pins, weights):
    path, tensors = weights

    @torch.jit.script
    def first_weight(p: str) -> torch.Tensor:
        return torch.ops.pins.load_file(p)["blk.0.w"]

    assert torch.equal(first_weight(path), tensors["blk.0.w"])


@pytest.mark.parametrize("header,data,says", [
    ({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 6]}}, b"\0" * 6, "needs 4"),
    ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, 'dtype: unknown dtype "Q4"'),
    ({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 3, "past the end of the data section"),
    ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6, 'overlap tensor "a"'),
    ({"w": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40], "data_offsets": [0, 4]}}, b"\0" * 4, "overflows 64 bits"),
    ({"w": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, b"\0" * 3, "has no torch dtype"),
    # As safetensors' reader: the tensors tile the data section.
    ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}, b"\0" * 12, "leave a gap of 4 bytes after tensor"),
    ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 9, "holds 5 bytes past the last tensor"),
])
def test_malformed_files_raise_value_error_naming_file_and_field(pins, tmp_path, header, data, says):
    path = write_safetensors(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(ValueError) as e:
        pins.load_file(path)
    assert path in str(e.value) and says in str(e.value), str(e.value)


def test_truncated_and_bad_json_and_missing_files(pins, tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x05\0\0")
    with pytest.raises(ValueError, match="shorter than the 8-byte header length"):
        pins.load_file(short)
    past = tmp_path / "past.safetensors"
    past.write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(ValueError, match="runs past the end of the file"):
        pins.load_file(past)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 5) + b"{'w':")
    with pytest.raises(ValueError, match="not valid JSON"):
        pins.load_file(bad)
    with pytest.raises(RuntimeError, match="nothing-here.safetensors: cannot open"):
        pins.load_file(tmp_path / "nothing-here.safetensors")
    with pytest.raises(ValueError, match="load_file: path must name a file"):
        pins.load_file("")


def test_random_loads_writes_and_casts_stay_bit_exact(pins, model, tmp_path):
    """Randomized: files loaded and dropped, tensors written in place before and
    after their pins exist (a version counter sees those writes), casts with and
    without a conversion, evictions; every result equals a reference kept in
    memory. Prints its seed."""
    import os
    import random
    seed = int(os.environ.get("PINS_SEED", random.randrange(1 << 30)))
    print(f"test_random_loads_writes_and_casts_stay_bit_exact seed={seed}")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.int32]
    files = []
    for f in range(3):
        tensors = {}
        for i in range(rng.randrange(2, 6)):
            dtype = rng.choice(dtypes)
            shape = (rng.randrange(1, 300), rng.randrange(1, 70))
            t = torch.randn(shape, generator=gen) * 100
            tensors[f"t{i}"] = t.to(dtype)
        path = str(tmp_path / f"f{f}.safetensors")
        safetensors_torch.save_file(tensors, path)
        files.append(path)
    loaded, reference = {}, {}
    before = pins.stats()
    for step in range(400):
        op = rng.random()
        if op < 0.1 or not loaded:
            path = rng.choice(files)
            for name, t in pins.load_file(path).items():  # (re)load: the file's bytes, whatever was written before
                loaded[(path, name)] = t
                reference[(path, name)] = safetensors_torch.load_file(path)[name].clone()
        elif op < 0.3:
            key = rng.choice(sorted(loaded))
            t = loaded[key]
            row = rng.randrange(t.shape[0])
            t[row] += 1  # in place, through the mapping
            reference[key][row] += 1
        elif op < 0.35:
            pins.free_pins(rng.randrange(1, 1 << 20))
        else:
            key = rng.choice(sorted(loaded))
            dtype = rng.choice([None, torch.float32])
            out = pins.cast_to_device(loaded[key], "cpu", dtype, model=model)
            want = reference[key] if dtype is None else reference[key].to(dtype)
            assert torch.equal(out, want), f"step {step}: {key} (seed {seed})"
    after = pins.stats()
    assert after["file_fills"] > before["file_fills"], "no pin was filled from a file"
    assert after["file_fills_written"] > before["file_fills_written"], "no written tensor was pinned"


def test_safetensors_reader_and_pins_accept_and_refuse_the_same_files(pins, tmp_path):
    """Files at the edges of the format: pins loads what safetensors' own reader
    loads (the same shapes and strides) and refuses what it refuses."""
    accepted = {
        "null_metadata": ({"__metadata__": None, "w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"ab"),
        # An empty tensor whose row-major strides pass int64: torch.empty refuses the shape.
        "huge_empty": ({"e": {"dtype": "F32", "shape": [0, 2 ** 32, 2 ** 32, 2 ** 32], "data_offsets": [0, 0]}}, b""),
    }
    for name, (header, data) in accepted.items():
        path = write_safetensors(tmp_path / f"{name}.safetensors", header, data)
        theirs, ours = safetensors_torch.load_file(path), pins.load_file(path)
        assert set(ours) == set(theirs), name
        for k in ours:
            assert ours[k].shape == theirs[k].shape and ours[k].stride() == theirs[k].stride(), (name, k)
            assert ours[k].numel() == 0 or torch.equal(ours[k], theirs[k]), (name, k)
    refused = {
        "gap": ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                 "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}, bytes(12)),
        "trailing": ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, bytes(8)),
    }
    for name, (header, data) in refused.items():
        path = write_safetensors(tmp_path / f"{name}.safetensors", header, data)
        with pytest.raises(Exception):
            safetensors_torch.load_file(path)
        with pytest.raises(ValueError, match=path):
            pins.load_file(path)


def test_a_header_that_is_not_utf8_raises_value_error_naming_the_file(pins, tmp_path):
    text = b'{"w\xff": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
    path = tmp_path / "latin1.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"x")
    with pytest.raises(ValueError) as e:
        pins.load_file(path)
    assert str(path) in str(e.value) and "not UTF-8 at byte 3 of the header (0xff" in str(e.value), str(e.value)


def test_a_deeply_nested_header_raises_value_error(pins, tmp_path):
    levels = 100_000  # a 200 KB header: the quoting of it in an error once overflowed the stack
    for i, value in enumerate(["[" * levels + "]" * levels, '{"k":' * levels + "1" + "}" * levels]):
        for field in ('{"w": %s}', '{"w": {"dtype": "F16", "shape": %s, "data_offsets": [0, 0]}}',
                      '{"__metadata__": %s}'):
            text = (field % value).encode()
            path = tmp_path / f"deep{i}.safetensors"
            path.write_bytes(struct.pack("<Q", len(text)) + text)
            with pytest.raises(ValueError) as e:
                pins.load_file(path)
            assert str(path) in str(e.value) and len(str(e.value)) < 400, str(e.value)[:400]


def _load_in_a_child(path, timeout=20):
    """pins.load_file(path) in a child process: (exit status, stderr); a hang is a timeout."""
    import os
    import subprocess
    import sys
    code = ("import sys, torch_pins as pins\n"
            "try:\n    pins.load_file(sys.argv[1])\n"
            "except (ValueError, RuntimeError) as e:\n    print(type(e).__name__, e, file=sys.stderr); sys.exit(3)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python_bindings"))
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env,
                         timeout=timeout)
    return out.returncode, out.stderr


def test_anything_but_a_regular_file_is_refused_without_blocking(pins, tmp_path):
    import os
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    rc, err = _load_in_a_child(str(fifo))  # opening a FIFO for reading waits for a writer: a timeout here
    assert rc == 3 and f"ValueError {fifo}: not a regular file (a FIFO)" in err, err
    for path, kind in [(str(tmp_path), "a directory"), ("/dev/null", "a character device")]:
        with pytest.raises(ValueError, match=f"not a regular file \\({kind}\\)"):
            pins.load_file(path)


def test_a_path_with_a_nul_byte_is_refused(pins, weights):
    path, _ = weights
    with pytest.raises(ValueError, match="path has a NUL byte at"):
        pins.load_file(path + "\0.ignored")


def test_a_model_larger_than_ram_maps(pins, tmp_path):
    """A file larger than RAM (sparse: no disk blocks) maps, and its tensors read:
    the mapping is charged as pages are written, not at once."""
    if open("/proc/sys/vm/overcommit_memory").read().strip() == "2":
        pytest.skip("vm.overcommit_memory=2 (strict) charges every private writable mapping whatever the flags")
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    ram = (int(meminfo["MemTotal"].split()[0]) + int(meminfo["SwapTotal"].split()[0])) * 1024
    n = ram + (8 << 30)
    text = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    text += b" " * (-(8 + len(text)) % 8)
    path = tmp_path / "larger_than_ram.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + n)
    w = pins.load_file(path)["w"]
    assert w.numel() == n
    assert int(w[:4096].sum()) == 0 and int(w[-4096:].sum()) == 0  # holes read as zeros
    w[-1] = 7  # one page written: one page charged
    assert int(w[-1]) == 7 and path.stat().st_blocks * 512 < (1 << 20)  # the file is never written


@pytest.mark.parametrize("path_kind", ["model=-1", "out=", "strided miss", "budget refused", "contiguous miss",
                                       "gathered model=-1", "gathered refused"])
def test_a_file_truncated_after_load_file_is_an_error_on_every_read_not_a_sigbus(tmp_path, path_kind):
    """Note [Truncated mappings]: every path on which pins reads a file-backed
    tensor itself (not a pin) raises naming the file; a read through the mapping
    of bytes the file lost would be a SIGBUS, so each runs in a child process."""
    import os
    import subprocess
    import sys
    path = str(tmp_path / "model.safetensors")
    safetensors_torch.save_file({"a": torch.randn(512, 512), "b": torch.randn(512, 512)}, path)
    calls = {
        "model=-1": "pins.cast_to_device(b, 'cpu')",
        "out=": "torch.ops.pins.cast_to_device.out(b, 'cpu', out=torch.empty_like(b))",
        "strided miss": "pins.cast_to_device(b.t(), 'cpu', model=m)",
        "budget refused": "pins.configure('cap:1'); pins.cast_to_device(b, 'cpu', model=m)",
        "contiguous miss": "pins.cast_to_device(b, 'cpu', model=m)",
        "gathered model=-1": "pins.cast_many_to_device([b, a], 'cpu')",
        "gathered refused": "pins.configure('cap:1'); pins.cast_many_to_device([b, a], 'cpu', model=m)",
    }
    code = f"""if True:
        import os, torch, torch_pins as pins
        t = pins.load_file({path!r})
        a, b = t["a"], t["b"]
        os.truncate({path!r}, os.path.getsize({path!r}) // 2)  # b's bytes are gone from the file
        m = pins.register_model("m", "cpu")
        try:
            {calls[path_kind]}
            print("no error")
        except RuntimeError as e:
            print("RuntimeError", e)
        print("pins", pins.stats()["pins"])
        """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python_bindings"))
    env.pop("PINS_CONF", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, f"exit {out.returncode} (a signal is negative): {out.stderr[-2000:]}"
    first, last = out.stdout.splitlines()[0], out.stdout.splitlines()[-1]
    assert first.startswith(f"RuntimeError {path}: the file"), out.stdout
    assert last == "pins 0", out.stdout  # no pin made of bytes that were not read


def _rewrite_in_place(path, tensors, truncate_first):
    """The file's bytes replaced through the same inode, as an editor or a
    trainer saving over it would."""
    import os
    new = path + ".new"
    safetensors_torch.save_file(tensors, new)
    data = open(new, "rb").read()
    os.remove(new)
    with open(path, "r+b") as f:
        if truncate_first:
            f.truncate(0)
        f.write(data)


@pytest.mark.parametrize("truncate_first", [False, True], ids=["written over", "truncated and written"])
def test_a_pinned_tensor_of_a_file_rewritten_in_place_is_pinned_again(pins, model, tmp_path, truncate_first):
    """Note [Changed files]: the next cast after a rewrite returns the bytes the
    tensor reads now, not the pin's old ones; every pin of that file goes."""
    import time
    path = str(tmp_path / "model.safetensors")
    safetensors_torch.save_file({"w": torch.zeros(128, 64), "b": torch.zeros(64)}, path)
    t = pins.load_file(path)
    w, b = t["w"], t["b"]
    start = pins.stats()
    pins.cast_to_device(w, "cpu", model=model)                 # streamed: pinned
    pins.cast_to_device(b, "cpu", model=model, resident=True)  # a cache pin of the same file
    assert pins.cast_to_device(w, "cpu", model=model).sum() == 0 and pins.stats()["hits"] == start["hits"] + 1
    before = pins.stats()
    time.sleep(0.01)  # past the kernel's coarse file-time tick of the first write
    _rewrite_in_place(path, {"w": torch.ones(128, 64), "b": torch.full((64,), 2.0)}, truncate_first)
    time.sleep(0.003)  # past one look interval (2 ms)
    assert float(w.sum()) == 128 * 64, "the mapping shows the new bytes"
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w)
    assert torch.equal(pins.cast_to_device(b, "cpu", model=model, resident=True), b)
    after = pins.stats()
    assert after["file_changes"] == before["file_changes"] + 1  # one look saw it, for both pins
    assert after["hits"] == before["hits"] and after["misses"] == before["misses"] + 2
    assert after["dropped"] == before["dropped"] + 2 and after["pins"] == before["pins"]
    # Unchanged since: hits again, from the new pins.
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model), w) and pins.stats()["hits"] == after["hits"] + 1


def test_an_unchanged_file_is_looked_at_most_every_interval(pins, model, weights):
    """Note [Changed files]: a hit costs a look (fstat) at most every 2 ms per
    file; many hits in a row within one interval find nothing changed."""
    path, _ = weights
    w = pins.load_file(path)["blk.0.w"]
    pins.cast_to_device(w, "cpu", model=model)
    before = pins.stats()
    for _ in range(200):
        pins.cast_to_device(w, "cpu", model=model)
    after = pins.stats()
    assert after["hits"] == before["hits"] + 200 and after["file_changes"] == before["file_changes"]
