"""Bad values of arguments and configuration are ValueErrors that name the argument
and what it got; a request the current state cannot serve is a RuntimeError
(Note [Error types] in ops/library.cpp). The two are unrelated Python types, so
pytest.raises(ValueError) also says "not a RuntimeError"."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("make,match", [
    (lambda: torch.empty(4, device="meta"), r"source must be a CPU tensor, got device meta"),
    (lambda: torch.eye(3).to_sparse(), r"source must be a dense \(strided\) tensor, got layout Sparse"),
    (lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8), r"source must not be quantized, got dtype QInt8"),
], ids=["device", "layout", "quantized"])
def test_bad_sources(pins, model, make, match):
    with pytest.raises(ValueError, match=match):
        pins.cast_to_device(make(), "cpu", model=model)
    with pytest.raises(ValueError, match=match):  # also on the plain-copy path
        pins.cast_to_device(make(), "cpu")


def test_unknown_kind(pins, model):
    with pytest.raises(ValueError, match=r"kind must be 'weights' or 'patches', got 'lora'"):
        pins.cast_to_device(torch.randn(4), "cpu", model=model, kind="lora")


def test_a_weights_signature_is_a_content_signature_not_an_error(pins, model):
    # On weights a signature is a content signature (the contract of
    # tests/python/test_contract.py): it says which content the pin holds.
    w = torch.randn(4)
    assert torch.equal(pins.cast_to_device(w, "cpu", model=model, signature=5), w)
    assert pins.stats()[f"model.{model}.weights.pins"] == 1
    for bad in ("v2", 1.5, True, 1 << 63):
        with pytest.raises(ValueError, match=r"cast_to_device: signature must be None or an int64, got "):
            pins.cast_to_device(w, "cpu", model=model, signature=bad)
    with pytest.raises(ValueError, match=r"cast_many_to_device: signature must be None or an int64, got str 'v2'"):
        pins.cast_many_to_device([w], "cpu", model=model, signature="v2")


def test_new_ops_name_their_bad_arguments(pins, model):
    w = torch.randn(4)
    cases = [
        (lambda: pins.cast_many_to_device([w, None], "cpu", model=model),
         r"sources\[1\] is None; None is not allowed in sources"),
        (lambda: pins.cast_many_to_device(w, "cpu", model=model), r"sources must be a list or tuple of tensors, got Tensor"),
        (lambda: pins.cast_many_to_device([w, 3], "cpu", model=model), r"sources\[1\] must be a tensor, got int"),
        (lambda: pins.cast_many_to_device([w, torch.empty(2, device="meta")], "cpu", model=model),
         r"cast_many_to_device: sources\[1\] must be a CPU tensor, got device meta"),
        (lambda: pins.cast_many_to_device([torch.eye(2).to_sparse()], "cpu"),
         r"sources\[0\] must be a dense \(strided\) tensor, got layout Sparse"),
        (lambda: pins.cast_many_to_device([w], "cpu", model=987654), r"cast_many_to_device: model 987654 is not registered"),
        (lambda: pins.cast_many_to_device([w], "cpu", model=-3), r"model must be a registered model id or -1, got -3"),
        (lambda: pins.cast_many_to_device([w], "cpu", model=model, kind="lora"),
         r"cast_many_to_device: kind must be 'weights' or 'patches', got 'lora'"),
        (lambda: pins.cast_to_device(w, "cpu", model=model, out=torch.empty(5)),
         r"out must have the source's shape \[4\], got out of shape \[5\]"),
        (lambda: pins.cast_to_device(w, "cpu", model=model, out=torch.empty(4, dtype=torch.float16)),
         r"out must have dtype Float \(the source's, no dtype given\), got out of dtype Half"),
        (lambda: pins.cast_to_device(w, "cpu", dtype=torch.bfloat16, model=model, out=torch.empty(4)),
         r"out must have dtype BFloat16 \(the dtype argument\), got out of dtype Float"),
        (lambda: pins.cast_to_device(w, "cpu", model=model, out=torch.empty(4, device="meta")),
         r"out must be on the device cpu, got out on meta"),
        (lambda: pins.cast_to_device(w, "cpu", model=model, out="buffer"), r"out must be a tensor, got str"),
        (lambda: pins.invalidate(torch.empty(4, device="meta")), r"invalidate: source must be a CPU tensor, got device meta"),
        (lambda: pins.invalidate(torch.eye(2).to_sparse()), r"invalidate: source must be a dense \(strided\) tensor"),
        (lambda: pins.invalidate_model(987654), r"invalidate_model: model 987654 is not registered"),
        (lambda: pins.register_model("m", "cpu", fast_disk="yes"), r"fast_disk must be a bool, got str 'yes'"),
        (lambda: pins.register_model("m", "cpu", size=-1), r"size must be a byte count \(an int >= 0\), got int -1"),
        (lambda: pins.register_model("m", "cpu", size=1.5), r"size must be a byte count \(an int >= 0\), got float 1.5"),
        (lambda: torch.ops.pins.register_model("m", torch.device("cpu"), False, -1),
         r"register_model: size must be a byte count >= 0, got -1"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(ValueError, match=r"out must be on the device cpu"):  # the op itself, not only the wrapper
        torch.ops.pins.cast_to_device.out(w, torch.device("cpu"), None, False, model, "weights", False, None,
                                          out=torch.empty(4, device="meta"))


def test_unknown_model(pins):
    with pytest.raises(ValueError, match=r"model 987654 is not registered"):
        pins.cast_to_device(torch.randn(4), "cpu", model=987654)
    with pytest.raises(ValueError, match=r"model must be a registered model id or -1, got -7"):
        pins.cast_to_device(torch.randn(4), "cpu", model=-7)
    for call in (lambda: pins.forget_model(987654), lambda: pins.set_active(987654, True),
                 lambda: pins.mark_prompt([987654]), lambda: pins.set_device_bytes(987654, 0, 0)):
        with pytest.raises(ValueError, match=r"model 987654 is not registered"):
            call()


def test_set_device_bytes_takes_byte_counts(pins, model):
    for args, what in (((-1, 10), r"nbytes must be a byte count \(an int >= 0\), got int -1"),
                       ((1, -2), r"total must be a byte count \(an int >= 0\), got int -2"),
                       ((True, 10), r"nbytes must be a byte count \(an int >= 0\), got bool True"),
                       ((1.5, 10), r"nbytes must be a byte count \(an int >= 0\), got float 1.5")):
        with pytest.raises(ValueError, match=what):
            pins.set_device_bytes(model, *args)
    with pytest.raises(ValueError, match=r"set_device_bytes: bytes must be a byte count >= 0, got -1"):
        torch.ops.pins.set_device_bytes(model, -1, 10)  # the op itself, not only the wrapper
    assert pins.stats()[f"model.{model}.device_bytes"] == -1, "a refused call says nothing"
    pins.set_device_bytes(model, 3, 10)
    assert pins.stats()[f"model.{model}.device_bytes"] == 3


def test_mark_prompt_is_all_or_nothing(pins, model):
    with pytest.raises(ValueError, match=r"model 987654 is not registered"):
        pins.mark_prompt([model, 987654])
    assert pins.stats()[f"model.{model}.in_prompt"] == 0


def test_negative_bytes(pins):
    with pytest.raises(ValueError, match=r"bytes must be non-negative, got -5"):
        pins.free_pins(-5)


def test_empty_model_name(pins):
    with pytest.raises(ValueError, match=r"name must not be empty"):
        pins.register_model("", "cpu")


@pytest.mark.parametrize("conf,match", [
    ("bogus:1", r"unknown key 'bogus'"),
    ("policy:fifo", r"'policy' expects one of mru\|lru\|trace\|reuse, got 'fifo'"),
    ("headroom:lots", r"'headroom' expects a byte size.*got 'lots'"),
    ("segment_size:2G", r"'segment_size' is a setting of the host pool"),
    ("backend:null", r"'backend' is a setting of the host pool"),
    ("noequals", r"'noequals' is not of the form key:value"),
])
def test_bad_configuration(pins, conf, match):
    before = pins.stats()
    with pytest.raises(ValueError, match=match):
        pins.configure(conf)
    with pytest.raises(ValueError, match=match):
        pins.configure("policy:trace," + conf)  # nothing applies when any part is bad
    pins.configure("fast_disk:false")
    assert pins.stats()["pins"] == before["pins"]


def test_bad_configuration_keyword(pins):
    with pytest.raises(ValueError, match=r"'fast_disk' expects a boolean \(true/false\), got 'maybe'"):
        pins.configure(fast_disk="maybe")


def test_configure_keywords(pins):
    pins.configure(policy="lru", fast_disk=True)
    m = pins.register_model("kw", "cpu")
    w = torch.randn(8)
    pins.cast_to_device(w, "cpu", model=m, resident=True)
    assert pins.stats()[f"model.{m}.weights-loaded.pins"] == 0
    pins.forget_model(m)


def run_with_conf(conf, code):
    env = dict(os.environ, PINS_CONF=conf, PYTHONPATH=os.path.join(ROOT, "python_bindings"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_locked_bytes_is_the_counter_of_stats():
    # mlock page-locks the cpu backend's pins, so there is something to count
    # without a GPU; locked_bytes() reads the one counter stats() also shows.
    code = """if True:
        import torch, torch_pins as p
        assert p.locked_bytes() == 0
        m = p.register_model("locked", "cpu")
        p.cast_to_device(torch.randn(1 << 18), "cpu", model=m)
        s = p.stats()
        print(p.locked_bytes(), s["locked_bytes"], s["pinned_bytes"])
        """
    out = run_with_conf("backend:cpu,mlock:true", code)
    assert out.returncode == 0, out.stderr
    locked, counter, pinned = map(int, out.stdout.split())
    assert locked == counter and locked >= pinned > 0


def test_a_state_that_cannot_serve_is_a_runtime_error():
    # A fresh process whose memory probe reads a meminfo that does not exist:
    # the arguments are fine, the system cannot answer.
    code = """if True:
        import torch, torch_pins as p
        m = p.register_model("probe", "cpu")
        for call in (p.end_prompt, lambda: p.cast_to_device(torch.randn(64), "cpu", model=m)):
            try:
                call()
            except ValueError as e:
                print("ValueError", e)
            except RuntimeError as e:
                print("RuntimeError", e)
        """
    out = run_with_conf("system_root:/nonexistent-pins-root", code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    for line in lines:
        assert line.startswith("RuntimeError cannot read /nonexistent-pins-root/proc/meminfo"), line


def test_a_bad_pins_conf_is_a_value_error_at_first_use():
    code = """if True:
        import torch_pins as p
        try:
            p.stats()
        except ValueError as e:
            print("ValueError", e)
        """
    out = run_with_conf("policy:fifo", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ValueError PINS_CONF key 'policy' expects one of mru|lru|trace|reuse, got 'fifo'"), out.stdout


def test_the_null_backend_is_refused_by_every_op_that_moves_bytes_and_stats_still_works():
    """backend:null keeps address bookkeeping only (the simulator's pool): a cast
    through it once wrote into an unmapped address and crashed the process."""
    code = """if True:
        import torch, torch_pins as p
        print("backend", p.stats()["backend.null"])  # stats reads the configuration, no byte moves
        calls = {
            "register_model": lambda: p.register_model("m", "cpu"),
            "cast_to_device": lambda: p.cast_to_device(torch.ones(1000), "cpu", model=0),
            "cast_many_to_device": lambda: p.cast_many_to_device([torch.ones(10)], "cpu", model=0),
            "free_pins": lambda: p.free_pins(1),
        }
        for name, call in calls.items():
            try:
                call()
                print(name, "accepted")
            except ValueError as e:
                print(name, "ValueError", e)
        """
    out = run_with_conf("backend:null", code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "backend 1", out.stdout
    for line in lines[1:]:
        assert " ValueError PINS_CONF key 'backend' is 'null', which keeps address bookkeeping only" in line, line
        assert "the torch ops need 'cpu', 'cuda', 'hip' or 'auto'" in line, line


def test_torchscript_reports_a_bad_value_as_a_runtime_error_with_the_message(pins):
    # torch's TorchScript interpreter re-raises every error of an op as a
    # RuntimeError (Note [Error types]); the message still names the argument.
    @torch.jit.script
    def free(n: int) -> int:
        return torch.ops.pins.free_pins(n, False)

    with pytest.raises(RuntimeError, match=r"bytes must be non-negative, got -3"):
        free(-3)
