import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python_bindings"))

DEFAULTS = "policy:mru,fast_disk:false,headroom:4G,pin_reserve:2G,cap:0,content_check:false"


@pytest.fixture
def pins():
    """The pins package with default settings restored around each test."""
    import torch_pins as p

    p.configure(DEFAULTS)
    yield p
    p.configure(DEFAULTS)


@pytest.fixture
def model(pins):
    m = pins.register_model("test-model", "cpu")
    yield m
    try:
        pins.forget_model(m)
    except ValueError:
        pass  # the test forgot it itself


@pytest.fixture
def fresh_compile():
    """torch.compile anew: Dynamo reset, and inductor's FX graph cache and
    AOTAutograd's cache off, which key a graph without the ops' tags, so code
    compiled against another build of pins could be served from them."""
    import torch
    import torch._functorch.config
    import torch._inductor.config

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()
