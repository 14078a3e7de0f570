"""torch_pins._C, the hot path of cast_to_device from Python (Note [Python fast
path], python_bindings/csrc/module.cpp): the repository's build puts it in the
package; torch_pins.cast_to_device calls it; it gives the op's results, stats
and errors, releases the GIL as the op does, forwards to the op whatever it does
not read itself (a TorchFunctionMode, a subclass with __torch_function__, other
argument types, keywords), and torch.compile traces the op instead of it.

Its counters (_C.path_counts()) say which path each call took."""
import os
import subprocess
import sys
import sysconfig
import threading

import pytest
import torch
import torch_pins  # noqa: F401 (loads the library, so the op below resolves)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The package's build for this torch's release (Note [One package, several torch releases]).
PACKAGE_LIB = torch_pins._library.release_dir(torch.__version__)
CPU = torch.device("cpu")
OP = torch.ops.pins.cast_to_device.default


@pytest.fixture
def fast(pins):
    if pins._C is None:
        pytest.skip("torch_pins._C is not loaded here; test_the_repository_build_puts_the_extension_in_the_package "
                    "says whether it should be")
    return pins._C


def paths_of(fast, call):
    """(what call() returned, {"fast": n, "forwarded": n} calls it made)."""
    before = fast.path_counts()
    result = call()
    after = fast.path_counts()
    return result, {k: after[k] - before[k] for k in after}


def outcome(call):
    """("ok", result) or (exception type, message)."""
    try:
        return "ok", call()
    except Exception as e:  # noqa: BLE001 (any exception: the two paths must raise the same)
        return type(e), str(e)


def test_the_repository_build_puts_the_extension_in_the_package(pins):
    if os.environ.get("PINS_LIBRARY"):
        pytest.skip("PINS_LIBRARY names another build's library: torch_pins._C is taken from beside it, if built")
    cache = os.path.join(ROOT, "build", "CMakeCache.txt")
    if os.path.isfile(cache) and "PINS_PYTHON_EXTENSION:STRING=OFF" in open(cache).read():
        pytest.skip("build/ is configured with PINS_PYTHON_EXTENSION=OFF")
    include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(include, "Python.h")):
        pytest.skip(f"this Python has no development headers ({include}/Python.h): the build cannot make the module")
    path = os.path.join(PACKAGE_LIB, "_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    assert os.path.isfile(path), (
        f"{path} is missing: build/ made no torch_pins._C (its configure says why: 'torch_pins._C skipped'), so "
        "every cast from Python pays the generic op call")
    assert pins.library_path() == os.path.join(PACKAGE_LIB, "libpins.so")
    assert pins._C is not None and pins._C.__file__ == path
    assert pins._cast_to_device is pins._C.cast_to_device
    assert pins._C.__name__ == "torch_pins._C" and sys.modules["torch_pins._C"] is pins._C


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("use_model", [True, False], ids=["model", "plain_copy"])
def test_fast_path_gives_the_ops_results_and_stats(pins, fast, model, dtype, use_model):
    m = model if use_model else -1
    w = torch.randn(64, 32).to(torch.float16)
    keys = ["hits", "misses", "plain_copies", "pins", "hit_bytes", "miss_bytes", "bypassed", f"model.{model}.hits",
            f"model.{model}.misses", f"model.{model}.pins", f"model.{model}.bytes", "weights.pins"]

    def miss_then_hit(call, source):
        before = pins.stats()
        results = [call(source), call(source)]
        after = pins.stats()
        return results, {k: after[k] - before[k] for k in keys}

    # Each path on its own source (equal values, both alive throughout), so each
    # makes its own miss, then its hit.
    w_op, w_fast = w.clone(), w.clone()
    want, op_stats = miss_then_hit(lambda s: OP(s, CPU, dtype, False, m), w_op)
    (got, fast_stats), paths = paths_of(
        fast, lambda: miss_then_hit(lambda s: fast.cast_to_device(s, CPU, dtype, False, m), w_fast))
    assert paths == {"fast": 2, "forwarded": 0}
    assert fast_stats == op_stats
    if use_model:
        assert fast_stats["misses"] == 1 and fast_stats["hits"] == 1, fast_stats
    else:
        assert fast_stats["plain_copies"] == 2 and fast_stats["pins"] == 0, fast_stats
    for a, b in zip(want, got):
        assert type(b) is torch.Tensor and torch.equal(a, b) and torch.equal(b, w.to(dtype or w.dtype))
        assert (b.dtype, b.device, b.shape, b.is_contiguous(), b.requires_grad) == \
            (a.dtype, a.device, a.shape, a.is_contiguous(), a.requires_grad)
    # The public wrapper takes the same path, with its defaults and conversions.
    (out, paths) = paths_of(fast, lambda: pins.cast_to_device(w, "cpu", dtype=dtype, model=m))
    assert paths == {"fast": 1, "forwarded": 0} and torch.equal(out, want[0])


def test_all_eight_arguments_and_a_parameter_take_the_fast_path(pins, fast, model):
    w = torch.nn.Parameter(torch.randn(16, 8))  # requires grad: the result must not
    (out, paths) = paths_of(fast, lambda: pins.cast_to_device(w, CPU, model=model, kind="patches", resident=True,
                                                              signature=7, non_blocking=True))
    assert paths == {"fast": 1, "forwarded": 0}
    assert type(out) is torch.Tensor and not out.requires_grad and out.grad_fn is None
    assert torch.equal(out, w.detach())
    s = pins.stats()
    assert s[f"model.{model}.patches-loaded.pins"] == 1 and s[f"model.{model}.patches-loaded.misses"] == 1, s
    # The same signature hits; another one makes the pin again (Note [Pin validity]).
    _, paths = paths_of(fast, lambda: fast.cast_to_device(w, CPU, None, False, model, "patches", True, 7))
    assert paths == {"fast": 1, "forwarded": 0} and pins.stats()[f"model.{model}.patches-loaded.hits"] == 1
    fast.cast_to_device(w, CPU, None, False, model, "patches", True, 8)
    assert pins.stats()[f"model.{model}.patches-loaded.misses"] == 2


def test_a_source_from_load_file_takes_the_fast_path(pins, fast, model, tmp_path):
    import safetensors.torch

    path = str(tmp_path / "w.safetensors")
    safetensors.torch.save_file({"w": torch.randn(32, 4)}, path)
    w = pins.load_file(path)["w"]
    fills = pins.stats()["file_fills"]
    (out, paths) = paths_of(fast, lambda: pins.cast_to_device(w, "cpu", model=model))
    assert paths == {"fast": 1, "forwarded": 0} and torch.equal(out, w)
    assert pins.stats()["file_fills"] == fills + 1, "the pin was filled from the file, as through the op"


# Calls whose arguments the fast path reads: the op's kernel raises (fast: 1).
RAISED_BY_THE_KERNEL = [
    ("model not registered", lambda m: (torch.randn(4), CPU, None, False, 987654)),
    ("model -2", lambda m: (torch.randn(4), CPU, None, False, -2)),
    ("meta source", lambda m: (torch.empty(4, device="meta"), CPU, None, False, m)),
    ("sparse source", lambda m: (torch.eye(3).to_sparse(), CPU, None, False, m)),
    ("quantized source", lambda m: (torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8), CPU, None, False,
                                    m)),
    ("meta source, plain copy", lambda m: (torch.empty(4, device="meta"), CPU, None, False, -1)),
    ("unknown kind", lambda m: (torch.randn(4), CPU, None, False, m, "lora")),
    ("kind with a NUL", lambda m: (torch.randn(4), CPU, None, False, m, "weights\0x")),
    # MPS: no Linux build of torch has it (a CUDA device would be served on a GPU machine).
    ("a device torch lacks", lambda m: (torch.randn(4), torch.device("mps"), None, False, m)),
    ("a device torch lacks, plain copy", lambda m: (torch.randn(4), torch.device("mps", 0), None, False, -1)),
]
# Calls it forwards to the op, which converts or refuses them (forwarded: 1): (args, kwargs).
FORWARDED = [
    ("device as a str", lambda m: ((torch.randn(4), "cpu", None, False, m), {})),
    ("device as an int", lambda m: ((torch.randn(4), 42, None, False, m), {})),
    ("dtype as a str", lambda m: ((torch.randn(4), CPU, "float", False, m), {})),
    ("non_blocking=1", lambda m: ((torch.randn(4), CPU, None, 1, m), {})),
    ("model=1.5", lambda m: ((torch.randn(4), CPU, None, False, 1.5), {})),
    ("model=True", lambda m: ((torch.randn(4), CPU, None, False, True), {})),
    ("model=2**70", lambda m: ((torch.randn(4), CPU, None, False, 2 ** 70), {})),
    ("kind as bytes", lambda m: ((torch.randn(4), CPU, None, False, m, b"weights"), {})),
    ("kind with a lone surrogate", lambda m: ((torch.randn(4), CPU, None, False, m, "w\ud800"), {})),
    ("resident=0", lambda m: ((torch.randn(4), CPU, None, False, m, "weights", 0), {})),
    ("signature=2**64", lambda m: ((torch.randn(4), CPU, None, False, m, "patches", True, 2 ** 64), {})),
    ("signature as a str", lambda m: ((torch.randn(4), CPU, None, False, m, "patches", True, "v2"), {})),
    ("source=None", lambda m: ((None, CPU, None, False, m), {})),
    ("source a list", lambda m: (([1.0, 2.0], CPU, None, False, m), {})),
    ("one argument", lambda m: ((torch.randn(4),), {})),
    ("nine arguments", lambda m: ((torch.randn(4), CPU, None, False, m, "weights", False, None, None), {})),
    ("an unknown keyword", lambda m: ((torch.randn(4), CPU), {"frobnicate": 1})),
    ("kind as a keyword", lambda m: ((torch.randn(4), CPU), {"model": m, "kind": "lora"})),
]


@pytest.mark.parametrize("name,make", RAISED_BY_THE_KERNEL, ids=[c[0] for c in RAISED_BY_THE_KERNEL])
def test_errors_of_the_fast_path_are_the_ops(pins, fast, model, name, make):
    args = make(model)
    want = outcome(lambda: OP(*args))
    got, paths = paths_of(fast, lambda: outcome(lambda: fast.cast_to_device(*args)))
    assert paths == {"fast": 1, "forwarded": 0}
    assert want[0] != "ok", want
    assert got == want


@pytest.mark.parametrize("name,make", FORWARDED, ids=[c[0] for c in FORWARDED])
def test_what_the_fast_path_does_not_read_goes_to_the_op(pins, fast, model, name, make):
    args, kwargs = make(model)
    want = outcome(lambda: OP(*args, **kwargs))
    got, paths = paths_of(fast, lambda: outcome(lambda: fast.cast_to_device(*args, **kwargs)))
    assert paths == {"fast": 0, "forwarded": 1}
    if want[0] == "ok":  # converted by the op's parse (a device given as a str, ...)
        assert got[0] == "ok" and torch.equal(got[1], want[1])
    else:
        assert got == want


def test_the_wrapper_raises_what_it_raised_before(pins, fast, model):
    # The public function's own checks come first, then the op's errors through the fast path.
    for call, error, match in [
        (lambda: pins.cast_to_device(torch.randn(4), "cpu", model=model, kind="lora"), ValueError,
         "kind must be 'weights' or 'patches', got 'lora'"),
        (lambda: pins.cast_to_device(torch.randn(4), "cpu", model=model, signature="v2"), ValueError,
         "signature must be None or an int64, got str 'v2'"),
        (lambda: pins.cast_to_device(torch.randn(4), "nowhere", model=model), RuntimeError, "nowhere"),
        (lambda: pins.cast_to_device(torch.randn(4), "cpu", model=987654), ValueError,
         "cast_to_device: model 987654 is not registered"),
    ]:
        with pytest.raises(error, match=match):
            call()


def assert_seen_by_watcher(fast, call, seen, w, path):
    """call() takes `path` ("fast" or "forwarded"), the watcher that filled
    `seen` saw the op, and the result is w's values."""
    out, paths = paths_of(fast, call)
    assert paths == {"fast": int(path == "fast"), "forwarded": int(path == "forwarded")}
    assert OP in seen, seen
    assert torch.equal(out, w)


def test_a_torch_function_mode_sees_the_call(pins, fast, model):
    from torch.overrides import TorchFunctionMode

    seen = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    w = torch.randn(8)
    with Watch():
        assert_seen_by_watcher(fast, lambda: pins.cast_to_device(w, "cpu", model=model), seen, w, "forwarded")


def test_a_subclass_with_torch_function_sees_the_call(pins, fast, model):
    seen = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    w = torch.randn(8)
    assert_seen_by_watcher(fast, lambda: pins.cast_to_device(w.as_subclass(Watched), "cpu", model=model), seen, w,
                           "forwarded")


def test_a_torch_dispatch_mode_sees_the_fast_call(pins, fast, model):
    # Below the Python entry: the dispatcher routes the typed call to the mode.
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    w = torch.randn(8)
    with Watch():
        assert_seen_by_watcher(fast, lambda: pins.cast_to_device(w, "cpu", model=model), seen, w, "fast")


def another_thread_runs_during(call):
    """Whether another Python thread ran while call() was in C++. With the switch
    interval at 1000 s the GIL changes hands only where a thread releases it, so
    the answer does not depend on timing, except that the call must last long
    enough for the other thread to be scheduled (a 64 MiB copy: tens of ms)."""
    state = {"in_call": False, "seen": None}
    go = threading.Event()

    def other():
        go.wait()
        state["seen"] = state["in_call"]

    thread = threading.Thread(target=other)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        thread.start()
        go.set()
        state["in_call"] = True
        call()
        state["in_call"] = False
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    return state["seen"]


@pytest.mark.parametrize("path", ["op", "fast"])
def test_the_gil_is_released_during_the_copy(pins, fast, path):
    x = torch.randn(16 << 20)
    cast = OP if path == "op" else fast.cast_to_device
    # The GIL held (a pure-Python loop): the other thread never runs, so the check can fail.
    assert another_thread_runs_during(lambda: sum(range(300_000))) is False
    # The results are kept: freeing a large tensor releases the GIL too.
    results = []
    assert any(another_thread_runs_during(lambda: results.append(cast(x, CPU, None, False, -1))) for _ in range(3))


def compile_works():
    """None, or why torch.compile cannot run here."""
    try:
        torch._dynamo.reset()
        f = torch.compile(lambda x: x * 2, fullgraph=True, backend="aot_eager")
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
        return None
    except Exception as e:  # noqa: BLE001
        return f"torch.compile does not run on this machine: {type(e).__name__}: {e}"


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_torch_compile_traces_the_op_without_a_graph_break(pins, fast, model, backend, fresh_compile):
    why = compile_works()
    if why:
        pytest.skip(why)
    import torch._dynamo

    w = torch.randn(32, 16)

    def f(x):
        return x @ pins.cast_to_device(w, "cpu", dtype=torch.float16, model=model).t()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(torch.randn(3, 16).half())
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)  # a graph break raises
    x = torch.randn(3, 16).half()
    hits = pins.stats()["hits"]
    for _ in range(2):
        out, paths = paths_of(fast, lambda: compiled(x))
        assert torch.equal(out, x @ w.half().t())
        assert paths == {"fast": 0, "forwarded": 0}, "the compiled graph calls the op itself"
    assert pins.stats()["hits"] >= hits + 1, "the compiled graph runs the real op"
    _, paths = paths_of(fast, lambda: f(x))
    assert paths == {"fast": 1, "forwarded": 0}, "eager calls take the fast path again"


def test_make_fx_records_the_op(pins, fast, model):
    # Tracers other than Dynamo call the wrapper's usual path: the extension
    # forwards to the op, or the dispatcher routes its call to their mode.
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return pins.cast_to_device(x, "cpu", dtype=torch.float16, model=model) * 2

    x = torch.randn(4, 4)
    graph = make_fx(f)(x)
    called = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert called == [OP, torch.ops.aten.mul.Tensor], called
    assert torch.equal(graph(x), x.half() * 2)


LOAD = """
import warnings
warnings.simplefilter("always")
import torch, torch_pins as p
m = p.register_model("m", "cpu")
w = torch.randn(8)
assert torch.equal(p.cast_to_device(w, "cpu", model=m), w) and p.stats()["misses"] == 1
print("C", p._C is not None, p._cast_to_device is p._cast_to_device_op)
"""


def run_with_library(lib_dir):
    env = dict(os.environ, PINS_LIBRARY=os.path.join(lib_dir, "libpins.so"),
               PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    out = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_a_library_without_the_extension_beside_it_casts_through_the_op(pins, tmp_path):
    import shutil

    shutil.copy(pins.library_path(), tmp_path / "libpins.so")
    out = run_with_library(str(tmp_path))
    assert "C False True" in out.stdout, out.stdout
    assert "Warning" not in out.stderr, out.stderr


def test_an_extension_that_does_not_load_warns_and_the_op_serves(pins, tmp_path):
    import shutil

    shutil.copy(pins.library_path(), tmp_path / "libpins.so")
    broken = tmp_path / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    broken.write_bytes(b"not an ELF file")  # as one built for another torch: ImportError at import
    out = run_with_library(str(tmp_path))
    assert "C False True" in out.stdout, out.stdout
    assert f"torch_pins: {broken} does not load, so cast_to_device calls the op on every cast" in out.stderr, \
        out.stderr
