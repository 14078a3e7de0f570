"""The demo's files: safetensors headers, the synthetic model files it writes,
the user's files it reads, and the layers a trace model is made of.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}``, offsets relative to the end of the header, which may be padded with
spaces) and the tensors' bytes.

Note [Demo files]
The demo's synthetic models are directories with one safetensors file per
layer (a sharded checkpoint taken to one shard per layer), each holding one
fp16 tensor of whole pages that starts on a page. The kernel's read-ahead on a
memory-mapped file reads up to tens of MB past the point read (measured on this
project's machine); within one file per model it runs into the next layers, so
the bytes a run reads from disk depend on the order of reads and on what the
page cache happened to keep around them, by up to 10% of a run. It stops at the
end of a file, so with a file per layer the kernel reads a layer's pages, plus
once per file the header's page, and the page cache of one layer can be
dropped without touching another (Note [Demo page cache] in replay.py).
A user's files (--files) are read as they are, one file or a directory of
shards per model.

Note [Demo digests]
The demo checks that a synthetic file it reuses holds the bytes it wrote: a
file of the right size whose bytes changed (a disk error, a copy gone wrong,
an edit) would otherwise be replayed as it is. digests.json beside the files
records, for each, the SHA-256 of the bytes written (hashed as they are
written; hashlib's fastest digest here, 1.2 GiB/s) and the file's status when
last checked: size, mtime, ctime, inode. A file is hashed again only when its
status does not prove it unchanged since. Hashing all 2.65 GB of the default
trace's files takes 5-6 s here from disk (2 s from the page cache); a stat
per file, 3 ms in all. mtime proves nothing: it can be set back (touch -d,
cp -p, rsync -t). ctime cannot (short of setting the clock): the kernel sets
it to the current time on every write, truncation, rename or utime. But a
status taken within RACY_NS of the file's ctime proves nothing either: a write
in the same tick of the file system's clock (coarse, down to seconds on some
file systems) leaves ctime as it was (git's "racily clean" index entries). A
file's status is taken as it is written, so the first check after writing
hashes each file once, reading back from the disk what was written (the
replays drop the files from the page cache); later starts cost a stat per
file. What this misses is a change made beneath the file system (a failing
disk, a raw write to the device), which changes no status. A file the demo
did not write (--files) is not checked.

Standard library only: the parent process of the demo never imports torch for
this (the files' bytes are written by ``write_file``'s caller).
"""
import hashlib
import json
import os
import re
import struct
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

PAGE = 4096
# safetensors' dtype names and their sizes in bytes.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# A header larger than this is not a safetensors header (the format's own limit is 100 MB).
MAX_HEADER = 100 * 1000 * 1000
# The synthetic files' digest, and the file beside them that records it (Note [Demo digests]).
DIGEST = "sha256"
DIGESTS_FILE = "digests.json"
# How long after a file's ctime its status must be taken to prove it unchanged since: longer than the
# coarsest timestamps of a Linux file system (1 s, or 2 s for FAT's) plus a clock tick.
RACY_NS = 3 * 10**9


class FileError(ValueError):
    """A file the demo cannot use; the message names the file and what is wrong."""


def named(what: str, path: str) -> str:
    """How an error names a file: ``--files unet='/x.safetensors'``, ``file '/x'``."""
    return f"{what}{path!r}" if what.endswith("=") else f"{what} {path!r}"


def failed(doing: Optional[str], e: OSError) -> FileError:
    """The FileError of an OSError met while `doing` (``cannot write model file
    '/x'``): the system's reason, and the paths it names that `doing` does not.
    Without `doing`, the paths and the reason."""
    reason = e.strerror or str(e) or type(e).__name__
    reason = reason[:1].lower() + reason[1:]
    paths = [repr(os.fsdecode(f)) for f in (e.filename, e.filename2) if f is not None]
    if doing is None:
        return FileError(f"{' -> '.join(paths) or 'a file'}: {reason}")
    others = [f for f in paths if f not in doing]
    return FileError(f"{doing}: {reason}" + (f" ({', '.join(others)})" if others else ""))


def write_atomic(path: str, write: Callable[[object], None], sync: bool = False) -> None:
    """Calls `write(f)` on a binary file that becomes `path` only once written
    whole (renamed from ``path.partial``; synced first with `sync`): a failure,
    an interrupt included, leaves `path` as it was and no partial file."""
    tmp = path + ".partial"
    try:
        with open(tmp, "wb") as f:
            write(f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:  # never created, or not ours to remove (a directory of that name)
            pass
        raise


class TensorEntry:
    """One tensor of a file: its name, dtype, shape and absolute byte range."""
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: List[int], begin: int, end: int):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class Header:
    """A parsed safetensors header: the tensors in file order and the metadata."""

    def __init__(self, path: str, data_start: int, tensors: List[TensorEntry], metadata: Dict[str, str]):
        self.path, self.data_start, self.tensors, self.metadata = path, data_start, tensors, metadata
        self.by_name = {t.name: t for t in tensors}


def read_header(path: str, what: str = "file") -> Header:
    """Parses and checks the header of safetensors file `path`; `what` names it in
    errors (``--files unet=...``). Raises FileError saying what is wrong."""
    def bad(msg: str) -> FileError:
        return FileError(f"{named(what, path)}: {msg}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"not a safetensors file: {size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > MAX_HEADER or 8 + n > size:
                raise bad(f"not a safetensors file: its first 8 bytes give a header of {n} bytes, "
                          f"the file has {size}")
            raw = f.read(n)
    except FileNotFoundError:
        raise bad("no such file") from None
    except IsADirectoryError:
        raise bad("is a directory, not a safetensors file") from None
    except PermissionError:
        raise bad("cannot be read (permission denied)") from None
    except OSError as e:
        raise failed(f"{named(what, path)}: cannot be read", e) from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"not a safetensors file: its header is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise bad(f"not a safetensors file: its header is a JSON {type(doc).__name__}, not an object")
    data_start = 8 + n
    metadata = doc.pop("__metadata__", {}) or {}
    tensors = []
    for name, e in doc.items():
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            raise bad(f"tensor {name!r}: expected dtype, shape and data_offsets, got {e!r}")
        dtype, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise bad(f"tensor {name!r}: unknown dtype {dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
        count = 1
        for d in shape:
            count *= d
        if not 0 <= b <= end or end - b != count * DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r}: data_offsets {[b, end]} do not hold shape {shape} of {dtype}")
        if data_start + end > size:
            raise bad(f"tensor {name!r}: its bytes end at {data_start + end}, past the end of the file ({size} "
                      f"bytes): the file is truncated")
        tensors.append(TensorEntry(name, dtype, list(shape), data_start + b, data_start + end))
    if not tensors:
        raise bad("holds no tensors")
    tensors.sort(key=lambda t: t.begin)
    return Header(path, data_start, tensors, {str(k): str(v) for k, v in metadata.items()})


class _Hashing:
    """A file's writer that also hashes what goes through it."""

    def __init__(self, f, digest):
        self.f, self.digest = f, digest

    def write(self, data) -> int:
        self.digest.update(data)
        return self.f.write(data)


def write_file(path: str, tensors: Sequence[Tuple[str, str, List[int]]], metadata: Dict[str, str],
               fill: Callable[[int, int, object], None]) -> str:
    """Writes a safetensors file whose data starts on a page: with tensors of whole
    pages (the demo's layers), every tensor starts on one (the format allows no
    gaps between tensors, so other sizes shift the ones after them).

    `tensors` is (name, dtype, shape) in file order. `fill(i, nbytes, f)` writes tensor i's bytes to the open
    file `f`. The file is written under a temporary name, synced and renamed, so
    a failed or interrupted write leaves no half-written file (write_atomic).
    Returns the digest of the bytes written (Note [Demo digests])."""
    header: Dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    sizes = []
    for i, (name, dtype, shape) in enumerate(tensors):
        count = 1
        for d in shape:
            count *= d
        nbytes = count * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        sizes.append(nbytes)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % PAGE)  # the data starts on a page
    digest = hashlib.new(DIGEST)

    def write(f) -> None:
        out = _Hashing(f, digest)
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for i, nbytes in enumerate(sizes):
            fill(i, nbytes, out)
    write_atomic(path, write, sync=True)  # synced: drop_from_page_cache drops written-back pages only
    return digest.hexdigest()


def drop_from_page_cache(path: str, begin: int = 0, length: int = 0) -> None:
    """Drops the file's pages in [begin, begin + length) (0: to the end) from the
    page cache, where no process maps them (posix_fadvise DONTNEED; no root
    needed). Written-back pages only: the demo's files are synced when written."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, begin, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# Layers from a file's tensor names, as the simulator groups a parameter list
# (docs/SIMULATOR.md, "Layers from the parameter list", `block` grouping): the
# name up to its first numeric component ("blocks.7", "down_blocks.2"); a name
# without one goes by its module ("head.head.weight" -> "head.head").
_NUMERIC = re.compile(r"^\d+$")


def layer_of(tensor_name: str) -> str:
    parts = tensor_name.split(".")
    for i, p in enumerate(parts):
        if _NUMERIC.match(p):
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) if len(parts) > 1 else tensor_name


def model_files(path: str, what: str) -> List[str]:
    """The safetensors files of a model: `path` itself, or every *.safetensors in
    directory `path` (a sharded checkpoint), sorted."""
    if os.path.isdir(path):
        try:
            found = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        except OSError as e:
            raise failed(f"{named(what, path)}: cannot be listed", e) from None
        if not found:
            raise FileError(f"{named(what, path)}: a directory with no .safetensors file in it")
        return found
    if not os.path.exists(path):
        raise FileError(f"{named(what, path)}: no such file or directory")
    return [path]


def layers_of(headers: Sequence[Header]) -> List[Tuple[str, List[Tuple[str, TensorEntry]]]]:
    """The layers of a model's files, in file and byte order: (layer name, its
    (file, tensor) pairs). A layer's tensors need not be adjacent, nor in one file."""
    order: List[str] = []
    groups: Dict[str, List[Tuple[str, TensorEntry]]] = {}
    for h in headers:
        for t in h.tensors:
            key = layer_of(t.name)
            if key not in groups:
                groups[key] = []
                order.append(key)
            groups[key].append((h.path, t))
    return [(k, groups[k]) for k in order]


def synthetic_shape(nbytes: int) -> Tuple[str, List[int]]:
    """dtype and shape of a synthetic weight of `nbytes`: fp16 rows of 2048 when
    they fit, else fp16 or bytes in one dimension."""
    if nbytes % 4096 == 0:
        return "F16", [nbytes // 4096, 2048]
    if nbytes % 2 == 0:
        return "F16", [nbytes // 2]
    return "U8", [nbytes]


def check_synthetic(path: str, expected: Dict[str, int], trace_name: str) -> Optional[str]:
    """None when the demo's file at `path` holds exactly the `expected` tensors
    (name -> bytes) written for `trace_name`; else why it must be written again.
    Raises FileError when something other than a file is in its place: that is
    not the demo's to replace."""
    if not os.path.exists(path):
        return "not written yet"
    if not os.path.isfile(path):
        kind = "a directory" if os.path.isdir(path) else "not a regular file"
        raise FileError(f"model file {path!r}: is {kind}; the demo writes its file there: move it away or choose "
                        "another --models-dir")
    try:
        h = read_header(path)
    except FileError as e:
        return str(e)
    if h.metadata.get("pins_demo_trace") != trace_name:
        return f"written for another trace ({h.metadata.get('pins_demo_trace')!r})"
    have = {t.name: t.nbytes for t in h.tensors}
    if have != expected:
        return "its tensors differ from the trace's layers"
    if os.path.getsize(path) != h.tensors[-1].end:
        return "its size does not match its header"
    return None


def file_digest(path: str) -> str:
    digest = hashlib.new(DIGEST)
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return digest.hexdigest()
            digest.update(view[:n])


def _status(st: os.stat_result) -> Dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


class Digests:
    """What the demo wrote in its models directory: DIGESTS_FILE there, {file
    relative to the directory: its digest and status when recorded} (Note
    [Demo digests]). Reading or writing it raises FileError naming it."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, DIGESTS_FILE)
        self.entries: Dict[str, dict] = {}
        self.unreadable: Optional[str] = None  # why a digests file that is there was not used
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            raise failed(f"cannot read the digests of the demo's files {self.path!r}", e) from None
        try:
            doc = json.loads(raw.decode("utf-8"))
            entries = doc["files"] if doc.get("digest") == DIGEST else None
            if not isinstance(entries, dict) or not all(
                    isinstance(e, dict) and isinstance(e.get(DIGEST), str) for e in entries.values()):
                raise ValueError(f"expected {{\"digest\": \"{DIGEST}\", \"files\": {{...}}}}")
        except (ValueError, UnicodeDecodeError, AttributeError, KeyError) as e:
            self.unreadable = f"{self.path!r} is not a digests file ({e})"
            return
        self.entries = entries

    def _key(self, path: str) -> str:
        return os.path.relpath(path, self.directory)

    def recorded(self, path: str) -> Optional[str]:
        """None when a digest of `path` is recorded; else why it must be written again."""
        if self._key(path) in self.entries:
            return None
        return self.unreadable or f"no digest of it in {self.path!r}"

    def proven(self, path: str) -> bool:
        """Whether `path`'s status proves it unchanged since its digest was recorded."""
        e = self.entries[self._key(path)]
        st = os.stat(path)
        return (_status(st) == {k: e.get(k) for k in ("size", "mtime_ns", "ctime_ns", "ino")}
                and st.st_ctime_ns + RACY_NS <= e.get("checked_ns", 0))

    def verify(self, path: str) -> Optional[str]:
        """Hashes `path`: None when its bytes are the ones recorded (its status
        is recorded anew), else why it must be written again."""
        key = self._key(path)
        st = os.stat(path)
        if file_digest(path) != self.entries[key][DIGEST]:
            del self.entries[key]
            return f"its bytes differ from those the demo wrote ({DIGEST} in {DIGESTS_FILE})"
        after = os.stat(path)
        if _status(after) == _status(st):  # else changed while hashed: its next check hashes it again
            self.entries[key] = dict(self.entries[key], **_status(after), checked_ns=time.time_ns())
        return None

    def forget(self, path: str) -> None:
        self.entries.pop(self._key(path), None)

    def record(self, path: str, digest: str) -> None:
        """Records the digest of the bytes just written to `path`."""
        self.entries[self._key(path)] = dict(_status(os.stat(path)), checked_ns=time.time_ns(), **{DIGEST: digest})

    def save(self) -> None:
        text = json.dumps({"digest": DIGEST, "files": self.entries}, indent=0, sort_keys=True).encode("utf-8")
        try:
            write_atomic(self.path, lambda f: f.write(text))
        except OSError as e:
            raise failed(f"cannot write the digests of the demo's files {self.path!r}", e) from None
