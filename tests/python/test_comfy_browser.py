"""The pins node in a real ComfyUI, seen in a real browser.

ComfyUI (COMFYUI_PATH, its own frontend package) runs as a server on the CPU
(``--cpu``) from its own Python (PINS_COMFY_PYTHON: a venv with torch,
torchvision, ComfyUI's requirements and torch-pins;
scripts/comfyui_server_venv.sh makes one), with the node installed from the
archive comfy-cli packs for the Comfy registry (``comfy node pack``;
PINS_COMFY_CLI or ``comfy`` on PATH) and a file of small test nodes.
Headless Chromium (PINS_CHROMIUM or Debian's ``chromium``), driven by
Playwright, opens the page, finds pins' sidebar tab, changes a setting, queues
two prompts and sees the counters move; ``python -m torch_pins stats --url``
reads the same route. With PINS_COMFY_SCREENSHOT set, the panel's screenshot
goes there (docs/comfyui-panel.png). Each missing piece skips the test, naming
it.
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import zipfile

import pytest

from test_cli import ROOT, cli

COMFYUI_PATH = os.environ.get("COMFYUI_PATH")
PYTHON = os.environ.get("PINS_COMFY_PYTHON")
COMFY_CLI = os.environ.get("PINS_COMFY_CLI") or shutil.which("comfy")
CHROMIUM = os.environ.get("PINS_CHROMIUM") or shutil.which("chromium")
try:
    import playwright.sync_api as playwright
except ImportError:
    playwright = None

pytestmark = [
    pytest.mark.skipif(not COMFYUI_PATH, reason="COMFYUI_PATH is not set: this test needs a ComfyUI checkout "
                                                "(scripts/comfyui_checkout.sh)"),
    pytest.mark.skipif(not PYTHON, reason="PINS_COMFY_PYTHON is not set: the Python that runs ComfyUI's server "
                                          "(scripts/comfyui_server_venv.sh makes one)"),
    pytest.mark.skipif(not COMFY_CLI, reason="no comfy-cli (`comfy` on PATH or PINS_COMFY_CLI) to pack the node"),
    pytest.mark.skipif(not CHROMIUM, reason="no chromium (apt-get install chromium, or PINS_CHROMIUM)"),
    pytest.mark.skipif(playwright is None, reason="playwright is not installed in this Python "
                                                  "(pip install playwright)"),
]

# Test nodes in the server: a loader (a safetensors file through ComfyUI's
# load_torch_file into comfy.ops.manual_cast layers, fp16 weights), a sampler
# (load_models_gpu, 4 steps of the model) and an output node.
TEST_NODES = '''
import torch
import comfy.model_management as mm
import comfy.model_patcher
import comfy.ops
import comfy.utils

ops = comfy.ops.manual_cast


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_in = ops.Linear(256, 512, dtype=torch.float16)
        self.proj_out = ops.Linear(512, 256, dtype=torch.float16)

    def forward(self, x):
        return self.proj_out(torch.nn.functional.silu(self.proj_in(x)))


class PinsTestLoader:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"path": ("STRING", {"default": ""})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, path):
        net = TinyNet()
        net.load_state_dict(comfy.utils.load_torch_file(path))
        device = mm.get_torch_device()
        return (comfy.model_patcher.ModelPatcher(net, load_device=device, offload_device=device),)


class PinsTestSampler:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "seed": ("INT", {"default": 0, "min": 0, "max": 1 << 30})}}
    RETURN_TYPES = ("LATENT",)
    FUNCTION = "sample"
    CATEGORY = "testing"

    def sample(self, model, seed):
        mm.load_models_gpu([model])
        x = torch.randn(2, 256, generator=torch.Generator().manual_seed(seed))
        for _ in range(4):
            x = x + 0.25 * model.model(x)
        return ({"samples": x},)


class PinsTestOutput:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",)}}
    RETURN_TYPES = ()
    FUNCTION = "store"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def store(self, samples):
        return {}


NODE_CLASS_MAPPINGS = {"PinsTestLoader": PinsTestLoader, "PinsTestSampler": PinsTestSampler,
                       "PinsTestOutput": PinsTestOutput}
'''


def _graph(weights, seed):
    return {"1": {"class_type": "PinsTestLoader", "inputs": {"path": weights}},
            "2": {"class_type": "PinsTestSampler", "inputs": {"model": ["1", 0], "seed": seed}},
            "3": {"class_type": "PinsTestOutput", "inputs": {"samples": ["2", 0]}}}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _pack_node(tmp_path):
    """The node as the Comfy registry gets it: `comfy node pack` in a copy of comfyui/."""
    work = tmp_path / "pack"
    shutil.copytree(os.path.join(ROOT, "comfyui"), work, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([COMFY_CLI, "--skip-prompt", "--no-enable-telemetry", "node", "pack"], cwd=work,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return work / "node.zip"


def _standins(tmp):
    """Empty torchaudio modules where the server's Python has none: ComfyUI 0.33
    imports torchaudio at module level, and no torchaudio on the package index
    goes with torch 2.14 (test_comfy.py stands in the same, in its process)."""
    if subprocess.run([PYTHON, "-c", "import torchaudio"], capture_output=True).returncode == 0:
        return {}
    package = tmp / "standins" / "torchaudio"
    package.mkdir(parents=True)
    for name in ("__init__.py", "transforms.py", "functional.py"):
        (package / name).write_text("")
    return {"PYTHONPATH": str(package.parent)}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("comfyui-browser")
    base = tmp / "base"
    archive = _pack_node(tmp)
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        z.extractall(base / "custom_nodes" / "comfyui-pins")
    assert "__init__.py" in names and "web/pins.js" in names and "pyproject.toml" in names, names
    (base / "custom_nodes" / "pins_test_nodes.py").write_text(TEST_NODES)
    user = base / "user" / "default"
    user.mkdir(parents=True)
    # Settings as the dialog stores them: serve casts to the CPU (--cpu), no first-run dialogs.
    (user / "comfy.settings.json").write_text(json.dumps({"pins.CpuTargets": True, "Comfy.TutorialCompleted": True}))
    from safetensors.torch import save_file
    import torch

    g = torch.Generator().manual_seed(0)
    shapes = {"proj_in.weight": (512, 256), "proj_in.bias": (512,), "proj_out.weight": (256, 512),
              "proj_out.bias": (256,)}
    weights = str(tmp / "tiny.safetensors")
    save_file({k: (torch.randn(s, generator=g) * 0.05).half() for k, s in shapes.items()}, weights)
    port = _free_port()
    log = open(tmp / "comfyui.log", "w")
    proc = subprocess.Popen([PYTHON, os.path.join(COMFYUI_PATH, "main.py"), "--cpu", "--base-directory", str(base),
                             "--listen", "127.0.0.1", "--port", str(port), "--disable-auto-launch"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=COMFYUI_PATH,
                            env=dict(os.environ, PINS_CONF="", PYTHONUNBUFFERED="1", **_standins(tmp)))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            _get(url + "/pins/stats")
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("ComfyUI did not start:\n" + (tmp / "comfyui.log").read_text()[-4000:])
            time.sleep(1)
    yield url, weights, tmp / "comfyui.log"
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _text(page, key):
    return page.locator(f'#pins-panel [data-pins="{key}"]').inner_text()


def test_panel_shows_pins_counters_move_with_prompts_queued_in_the_browser(server):
    url, weights, log = server
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_function("() => window.app && window.app.extensionManager", timeout=120_000)
        page.wait_for_timeout(2000)
        for _ in range(5):  # first-run dialogs (templates) over the page
            if page.locator('[data-testid="dialog-overlay"]').count() == 0:
                break
            page.keyboard.press("Escape")
            page.wait_for_timeout(500)
        page.locator(".pins-tab-button").first.click(timeout=60_000)
        page.wait_for_selector('#pins-panel [data-pins="state"]', timeout=30_000)
        assert _text(page, "state").startswith("pins is on (old-loader mode): policy trace (default), sharing off")
        assert _text(page, "total-hits") == "0"
        assert "cpu_targets" not in _text(page, "config") and "policy trace (default)" in _text(page, "config")

        # A setting changed in the dialog's store goes to the server, live.
        page.evaluate("() => window.app.extensionManager.setting.set('pins.Policy', 'mru')")
        page.wait_for_function("() => document.querySelector('#pins-panel [data-pins=\"state\"]')"
                               ".innerText.includes('policy mru (configure())')", timeout=30_000)
        assert _get(url + "/pins/stats")["config"]["policy"] == {"value": "mru", "source": "configure()"}

        for seed in range(2):  # queued through the frontend, as its Run button does
            page.evaluate("async ([graph]) => { await window.app.loadApiJson(graph, 'pins test');"
                          " await window.app.queuePrompt(0); }", [_graph(weights, seed)])
            page.wait_for_function(f"() => document.querySelector('#pins-panel svg[data-pins=\"chart\"]')"
                                   f".querySelectorAll('text').length == {seed + 1}", timeout=120_000)
        hits, misses = int(_text(page, "total-hits")), int(_text(page, "total-misses"))
        assert misses == 2 and hits == 2 * 4 * 2 - 2, (hits, misses)  # 2 layers, 4 steps, 2 prompts
        assert _text(page, "total-hit_bytes").endswith(("KiB", "MiB")) and "TinyNet" in _text(page, "models")
        assert _text(page, "prompt-misses") == "0" and _text(page, "prompt-hits") == "8"  # the last prompt's
        screenshot = os.environ.get("PINS_COMFY_SCREENSHOT")
        if screenshot:
            page.screenshot(path=screenshot)
        browser.close()

    r = _get(url + "/pins/stats")
    first, second = r["prompts"]["last"]
    assert (first["misses"], second["misses"], second["hits"]) == (2, 0, 8), r["prompts"]
    assert r["comfy"]["enabled"] and r["comfy"]["casts"] == 16
    out = cli("stats", "--url", url)
    assert out.returncode == 0, out.stderr
    assert "ComfyUI    pins on, old-loader mode" in out.stdout and "policy mru (configure())" in \
        " ".join(out.stdout.split())
    text = log.read_text()
    assert "IMPORT FAILED" not in text and "torch_pins 0.1.0: active in ComfyUI" in text, text[-3000:]
