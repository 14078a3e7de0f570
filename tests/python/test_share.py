"""Note [Shared pins] (csrc/share/host_share.h) through the ops, across real
processes: PINS_CONF share:true makes a pin of a pins.load_file tensor a
segment every process of the host maps; a second process joins it instead of
reading the disk; a patched weight stays private; the last process out leaves
nothing behind; a directory open to others is not used (the process pins
privately and says why); a file rewritten in place is never served from a
segment filled before; `python -m torch_pins share --clean` removes what a
process that died left."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

safetensors_torch = pytest.importorskip("safetensors.torch")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sharing is Linux-only")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A worker: loads the model, casts every tensor, prints its stats and results'
# checksums, and (with HOLD) waits for a line on stdin before it exits.
WORKER = textwrap.dedent(r"""
    import json, os, sys
    import torch
    sys.path.insert(0, os.path.join(sys.argv[1], "python_bindings"))
    import torch_pins as pins
    path, patch = sys.argv[2], sys.argv[3] == "patch"
    tensors = pins.load_file(path)
    if os.environ.get("WAIT_BEFORE_CAST"):
        print("loaded", flush=True)
        sys.stdin.readline()
    m = pins.register_model("share-test", "cpu")
    pins.mark_prompt([m])
    if patch:
        tensors["w0"].add_(1)  # written through the mapping: its pin may not be shared
    sums = {}
    for _ in range(2):
        for name, t in tensors.items():
            out = pins.cast_to_device(t, "cpu", model=m)
            assert torch.equal(out, t), name
            sums[name] = float(out.double().sum())
    s = pins.stats()
    print(json.dumps({"sums": sums, "stats": {k: v for k, v in s.items()
                                               if k.startswith("share_") or k in ("hits", "misses", "file_fills")}}),
          flush=True)
    if os.environ.get("HOLD"):
        sys.stdin.readline()
    if os.environ.get("OS_EXIT"):
        os._exit(0)  # as a multiprocessing worker ends: no atexit handler runs
""")


@pytest.fixture
def model_file(tmp_path):
    gen = torch.Generator().manual_seed(1)
    tensors = {f"w{i}": torch.randn(256, 512, generator=gen) for i in range(6)}
    tensors["b"] = torch.randn(77, generator=gen).half()  # an odd size
    path = str(tmp_path / "m.safetensors")
    safetensors_torch.save_file(tensors, path)
    return path, tensors


@pytest.fixture
def share_root(tmp_path_factory):
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    import tempfile
    d = tempfile.mkdtemp(prefix="pins-share-py-", dir=base)
    yield d
    subprocess.run(["rm", "-rf", d], check=False)


def start(path, root, hold=False, patch=False, share=True, **flags):
    conf = "monitor:false,prewarm:false" + (f",share:true,share_dir:{root}" if share else "")
    env = dict(os.environ, PINS_CONF=conf)
    for k in ("HOLD", "WAIT_BEFORE_CAST", "OS_EXIT"):
        env.pop(k, None)
    if hold:
        env["HOLD"] = "1"
    env.update({k: "1" for k, v in flags.items() if v})
    return subprocess.Popen([sys.executable, "-c", WORKER, ROOT, path, "patch" if patch else "plain"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(p):
    line = p.stdout.readline()
    if not line:
        p.wait(timeout=60)
        raise AssertionError(f"worker failed: {p.stderr.read()}")
    return json.loads(line)


def finish(p):
    if p.stdin and not p.stdin.closed:
        p.stdin.write("\n")
        p.stdin.flush()
    p.wait(timeout=60)
    assert p.returncode == 0, p.stderr.read()


def share_dir(root):
    return os.path.join(root, f"pins-{os.geteuid()}")


def test_second_process_joins_the_first_ones_pins(model_file, share_root):
    path, tensors = model_file
    first = start(path, share_root, hold=True)
    a = report(first)
    assert a["stats"]["share_fills"] == len(tensors) and a["stats"]["share_joins"] == 0
    assert a["stats"]["share_processes"] == 1 and a["stats"]["share_state"] == 1
    segs = [f for f in os.listdir(share_dir(share_root)) if f.startswith("seg-")]
    assert len(segs) == len(tensors)
    for f in segs:
        assert os.stat(os.path.join(share_dir(share_root), f)).st_mode & 0o777 == 0o600
    second = start(path, share_root, hold=True)
    b = report(second)
    assert b["stats"]["share_joins"] == len(tensors), b["stats"]
    assert b["stats"]["share_fills"] == 0 and b["stats"]["file_fills"] == 0, "the second process read the file"
    assert b["stats"]["share_processes"] == 2
    assert b["sums"] == a["sums"]
    finish(second)
    assert os.path.isdir(share_dir(share_root)), "the first still holds its pins"
    finish(first)
    assert not os.path.exists(share_dir(share_root)), "the last process out removes everything"


def test_a_patched_weight_is_pinned_privately(model_file, share_root):
    path, tensors = model_file
    first = start(path, share_root, hold=True, patch=True)
    a = report(first)
    # w0 was written through its mapping: its pin is the process's own, as are
    # those of its neighbours in the file that share a written page with it.
    assert len(tensors) - 3 <= a["stats"]["share_fills"] <= len(tensors) - 1
    assert a["sums"]["w0"] == pytest.approx(float((tensors["w0"] + 1).double().sum()), rel=1e-6)
    second = start(path, share_root, hold=False)
    b = report(second)
    finish(second)
    # The other process gets the file's bytes for w0 (it fills that segment) and joins the rest.
    assert b["sums"]["w0"] == pytest.approx(float(tensors["w0"].double().sum()), rel=1e-9)
    assert b["stats"]["share_joins"] == a["stats"]["share_fills"]
    assert b["stats"]["share_fills"] == len(tensors) - a["stats"]["share_fills"]
    finish(first)
    assert not os.path.exists(share_dir(share_root))


def test_sharing_off_shares_nothing(model_file, share_root):
    path, tensors = model_file
    p = start(path, share_root, share=False)
    r = report(p)
    finish(p)
    assert not any(k.startswith("share_") for k in r["stats"])
    assert r["stats"]["file_fills"] == len(tensors)
    assert not os.path.exists(share_dir(share_root))


def test_a_directory_open_to_others_is_not_used_and_the_process_says_so(model_file, share_root):
    # Issue 38: a share directory this process may not use (here open to
    # others; also another user's, missing, read-only, not tmpfs, full, all
    # slots taken) used to make every pins call raise. Sharing is an
    # optimisation: the process pins privately and says why, once.
    path, tensors = model_file
    os.mkdir(share_dir(share_root), 0o755)
    os.chmod(share_dir(share_root), 0o755)
    p = start(path, share_root)
    r = report(p)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    s = r["stats"]
    assert s["share_state"] == 0 and s["share_state.owner"] == 1, s
    assert s["file_fills"] == len(tensors), "every tensor pinned privately, from its file"
    assert s["share_fills"] == 0 and s["share_joins"] == 0
    warnings = [line for line in err.splitlines() if line.startswith("pins: warning: share:")]
    assert len(warnings) == 1, err
    assert share_dir(share_root) in warnings[0] and "mode 755" in warnings[0] and "pins privately" in warnings[0]
    assert os.listdir(share_dir(share_root)) == [], "nothing made in a directory it does not trust"


def test_a_file_rewritten_in_place_is_not_served_from_a_segment_filled_before(model_file, share_root):
    # Issue 38: a process that loaded the file before it was rewritten in place
    # (same path, same inode) used to join the segment a peer filled before the
    # rewrite and serve the old bytes. It serves what it would without sharing.
    path, tensors = model_file
    first = start(path, share_root, hold=True)
    a = report(first)
    assert a["stats"]["share_fills"] == len(tensors)
    second = start(path, share_root, hold=True, WAIT_BEFORE_CAST=True)
    assert second.stdout.readline().strip() == "loaded"
    new = {k: (v * 3 + 1).to(v.dtype) for k, v in tensors.items()}
    fresh = path + ".new"
    safetensors_torch.save_file(new, fresh)
    data = open(fresh, "rb").read()
    assert len(data) == os.path.getsize(path), "same shapes and dtypes: the same size"
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(data)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second.stdin.write("\n")
    second.stdin.flush()
    b = report(second)
    assert b["stats"]["share_joins"] == 0, b["stats"]
    want = {k: float(v.double().sum()) for k, v in new.items()}
    assert b["sums"] == want, "bytes of the file before its rewrite were served"
    finish(second)
    finish(first)


def test_share_clean_removes_what_a_dead_process_left(model_file, share_root):
    # Issue 38: a process that ends by os._exit (as multiprocessing workers do)
    # or is killed leaves its segments, RAM in tmpfs, until another process
    # attaches; `python -m torch_pins share --clean` is that process.
    path, tensors = model_file
    p = start(path, share_root, OS_EXIT=True)
    report(p)
    p.wait(timeout=60)
    assert p.returncode == 0
    left = [f for f in os.listdir(share_dir(share_root)) if f.startswith("seg-")]
    assert len(left) == len(tensors), "os._exit leaves the segments"
    cli = [sys.executable, "-m", "torch_pins", "share", "--share-dir", share_root]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    env.pop("PINS_CONF", None)
    out = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{share_dir(share_root)}: {len(tensors)} segment files" in out.stdout, out.stdout
    out = subprocess.run(cli + ["--clean"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"cleaned: {len(tensors)} segment files" in out.stdout and "the directory is gone" in out.stdout, out.stdout
    assert not os.path.exists(share_dir(share_root))


def test_share_clean_keeps_a_live_processes_pins(model_file, share_root):
    path, tensors = model_file
    live = start(path, share_root, hold=True)
    report(live)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    env.pop("PINS_CONF", None)
    out = subprocess.run([sys.executable, "-m", "torch_pins", "share", "--share-dir", share_root, "--clean"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "cleaned: 0 segment files" in out.stdout and "1 live processes keep" in out.stdout, out.stdout
    assert len([f for f in os.listdir(share_dir(share_root)) if f.startswith("seg-")]) == len(tensors)
    finish(live)
    assert not os.path.exists(share_dir(share_root))


def test_share_keys_are_fixed_after_first_use(pins):
    # Sharing is decided when the runtime is built (PINS_CONF); configure() cannot switch it.
    flip = "false" if pins.config()["share"] == "true" else "true"
    with pytest.raises(ValueError, match="'share'"):
        pins.configure(f"share:{flip}")
    with pytest.raises(ValueError, match="'share_dir'"):
        pins.configure("share_dir:/elsewhere")


def test_share_bench_meets_its_targets_at_small_scale(tmp_path):
    # profiling/share_bench.py end to end on a 64 MiB model, two processes:
    # one pinned copy for both, nothing read from disk by the late one.
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "share_bench.py"), "--gib", "0.0625",
                          "--procs", "2", "--rounds", "2", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = out.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT "), out.stdout
    figures = dict(kv.split("=") for kv in result.split()[1:])
    assert float(figures["ram_ratio"]) <= 1.15, result
    assert float(figures["second_disk_ratio"]) <= 0.05, result
    assert float(figures["private_ram_ratio"]) >= 1.9, result  # two private copies, for contrast
    assert "files left after the last exit: False" in out.stdout


def test_share_h2d_bench_explains_a_missing_device():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: profiling/gpu_check.sh runs the benchmark itself")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "profiling", "bench_share_h2d.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "needs a CUDA device" in out.stdout, out.stdout + out.stderr
