"""Bad input gets a RuntimeError that names the argument and what it got."""
import pytest
import torch


@pytest.mark.parametrize("make,match", [
    (lambda: torch.empty(4, device="meta"), r"source must be a CPU tensor, got device meta"),
    (lambda: torch.eye(3).to_sparse(), r"source must be a dense \(strided\) tensor, got layout Sparse"),
    (lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8), r"source must not be quantized, got dtype QInt8"),
])
def test_bad_sources(pins, model, make, match):
    with pytest.raises(RuntimeError, match=match):
        pins.cast_to_device(make(), "cpu", model=model)


def test_unknown_kind(pins, model):
    with pytest.raises(RuntimeError, match=r"kind must be 'weights' or 'patches', got 'lora'"):
        pins.cast_to_device(torch.randn(4), "cpu", model=model, kind="lora")


def test_signature_needs_patches(pins, model):
    with pytest.raises(RuntimeError, match=r"needs kind='patches'.*signature 5"):
        pins.cast_to_device(torch.randn(4), "cpu", model=model, signature=5)


def test_unknown_model(pins):
    with pytest.raises(RuntimeError, match=r"model 987654 is not registered"):
        pins.cast_to_device(torch.randn(4), "cpu", model=987654)
    with pytest.raises(RuntimeError, match=r"model must be a registered model id or -1, got -7"):
        pins.cast_to_device(torch.randn(4), "cpu", model=-7)
    for call in (lambda: pins.forget_model(987654), lambda: pins.set_active(987654, True),
                 lambda: pins.mark_prompt([987654])):
        with pytest.raises(RuntimeError, match=r"model 987654 is not registered"):
            call()


def test_mark_prompt_is_all_or_nothing(pins, model):
    with pytest.raises(RuntimeError):
        pins.mark_prompt([model, 987654])
    assert pins.stats()[f"model.{model}.in_prompt"] == 0


def test_negative_bytes(pins):
    with pytest.raises(RuntimeError, match=r"bytes must be non-negative, got -5"):
        pins.free_pins(-5)


def test_empty_model_name(pins):
    with pytest.raises(RuntimeError, match=r"name must not be empty"):
        pins.register_model("", "cpu")


@pytest.mark.parametrize("conf,match", [
    ("bogus:1", r"unknown key 'bogus'"),
    ("policy:fifo", r"'policy' expects one of mru\|lru\|trace, got 'fifo'"),
    ("headroom:lots", r"'headroom' expects a byte size.*got 'lots'"),
    ("segment_size:2G", r"'segment_size' is a setting of the host pool"),
    ("backend:null", r"'backend' is a setting of the host pool"),
    ("noequals", r"'noequals' is not of the form key:value"),
])
def test_bad_configuration(pins, conf, match):
    before = pins.stats()
    with pytest.raises(RuntimeError, match=match):
        pins.configure(conf)
    with pytest.raises(RuntimeError, match=match):
        pins.configure("policy:trace," + conf)  # nothing applies when any part is bad
    pins.configure("fast_disk:false")
    assert pins.stats()["pins"] == before["pins"]


def test_configure_keywords(pins):
    pins.configure(policy="lru", fast_disk=True)
    m = pins.register_model("kw", "cpu")
    w = torch.randn(8)
    pins.cast_to_device(w, "cpu", model=m, resident=True)
    assert pins.stats()[f"model.{m}.weights-loaded.pins"] == 0
    pins.forget_model(m)
