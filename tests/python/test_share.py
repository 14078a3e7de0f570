"""Note [Shared pins] (csrc/share/host_share.h) through the ops, across real
processes: PINS_CONF share:true makes a pin of a pins.load_file tensor a
segment every process of the host maps; a second process joins it instead of
reading the disk; a patched weight stays private; the last process out leaves
nothing behind; a directory open to others is refused."""
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


def start(path, root, hold=False, patch=False, share=True):
    conf = "monitor:false,prewarm:false" + (f",share:true,share_dir:{root}" if share else "")
    env = dict(os.environ, PINS_CONF=conf)
    env.pop("HOLD", None)
    if hold:
        env["HOLD"] = "1"
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
    assert a["stats"]["share_processes"] == 1
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


def test_a_directory_open_to_others_is_refused(model_file, share_root):
    path, _ = model_file
    os.mkdir(share_dir(share_root), 0o755)
    os.chmod(share_dir(share_root), 0o755)
    p = start(path, share_root)
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert share_dir(share_root) in err and "mode 755" in err, err


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
