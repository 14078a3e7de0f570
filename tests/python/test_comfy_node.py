"""The ComfyUI node package (comfyui/) and what it serves, without a ComfyUI
checkout: loaded the way ComfyUI's load_custom_node loads a folder, against the
stand-ins of test_comfy_standins.py; pins' report (torch_pins.report(), Note
[Prompt history]) and `python -m torch_pins stats --url`. The node in a real
ComfyUI, in a real browser: test_comfy_browser.py."""
import http.server
import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import types

import pytest
import torch

from test_cli import ROOT, cli
from test_comfy_standins import _stand_in_comfy

NODE = os.path.join(ROOT, "comfyui")


def _load_node(path=NODE):
    """What ComfyUI's load_custom_node does with a folder: its __init__.py as a
    package named after the folder's path."""
    name = path.replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module, sys.modules[name + ".routes"]


def test_prompt_history_records_what_each_prompt_moved(pins):
    pins.end_prompt()  # closes the record of what earlier tests moved
    m = pins.register_model("history", "cpu")
    w = torch.randn(64, 64)
    try:
        for _ in range(2):
            with pins.prompt([m]):
                pins.set_active(m, True)
                pins.cast_to_device(w, "cpu", dtype=torch.float16, model=m)
        r = pins.report()
        first, second = r["prompts"]["last"][-2:]
        assert (first["misses"], first["hits"]) == (1, 0), first
        assert (second["misses"], second["hits"]) == (0, 1), second
        assert second["hit_bytes"] == w.nbytes and second["prompt"] == first["prompt"] + 1
        assert r["prompts"]["current"]["hits"] == 0  # nothing since the last end_prompt
        assert r["prompts"]["total"]["hits"] == r["counters"]["hits"]
        model = next(x for x in r["models"] if x["id"] == m)
        assert model["name"] == "history" and model["subsets"]["weights"]["bytes"] == w.nbytes
        assert model["hits"] == 1 and model["misses"] == 1
        assert r["budget"]["pinned_bytes"] == r["counters"]["pinned_bytes"] <= r["budget"]["limit_bytes"]
    finally:
        pins.forget_model(m)


class _Served(http.server.BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self):  # noqa: N802  (http.server's name)
        if self.path != "/pins/stats":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_stats_url_prints_a_served_report_as_the_local_table(pins):
    report = pins.report()
    report["config"]["policy"] = {"value": "reuse", "source": "configure()"}  # not this process's
    report["counters"]["hits"] = 123456
    report["comfy"] = {"enabled": True, "mode": "old-loader"}
    _Served.body = json.dumps(report).encode()
    server = http.server.HTTPServer(("127.0.0.1", 0), _Served)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        out = cli("stats", "--url", url + "/")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert any(line.split() == ["policy", "reuse", "(configure())"] for line in lines), out.stdout
        assert "ComfyUI    pins on, old-loader mode" in lines
        assert any(line.split()[:2] == ["hits", "123,456"] for line in lines), out.stdout
        assert any(line.startswith("this prompt: ") for line in lines)
        out = cli("stats", "--url", url, "--json")
        assert json.loads(out.stdout)["counters"]["hits"] == 123456
    finally:
        server.shutdown()
    out = cli("stats", "--url", url)  # nothing listens there now
    assert out.returncode == 2
    assert f"cannot read {url}/pins/stats" in out.stderr and "pins node" in out.stderr


@pytest.fixture
def comfy_host(monkeypatch, tmp_path, pins):
    """Stand-in ComfyUI modules, a folder_paths whose user directory is tmp_path,
    and the node unloaded and pins' integration disabled afterwards."""
    import torch_pins.comfy as integration

    for name in [n for n in sys.modules if n.startswith("comfy.")]:
        monkeypatch.delitem(sys.modules, name)
    for name, module in _stand_in_comfy().items():
        monkeypatch.setitem(sys.modules, name, module)
    folder_paths = types.ModuleType("folder_paths")
    folder_paths.get_user_directory = lambda: str(tmp_path)
    monkeypatch.setitem(sys.modules, "folder_paths", folder_paths)
    monkeypatch.delenv(integration.ENV_VAR, raising=False)
    (tmp_path / "default").mkdir()
    yield tmp_path
    integration.disable()
    for name in [n for n in sys.modules if n.startswith(NODE.replace(".", "_x_"))]:
        del sys.modules[name]


def _settings(user_dir, **values):
    (user_dir / "default" / "comfy.settings.json").write_text(json.dumps(values))


def test_node_enables_pins_with_the_settings_of_comfyuis_dialog(comfy_host, pins, caplog):
    import torch_pins.comfy

    _settings(comfy_host, **{"Comfy.Other": 1, "pins.Policy": "lru", "pins.CpuTargets": True, "pins.Headroom": "3G"})
    with caplog.at_level(logging.INFO, logger="torch_pins.comfy"):
        node, routes = _load_node()
    assert node.NODE_CLASS_MAPPINGS == {} and node.WEB_DIRECTORY == "./web"
    assert torch_pins.comfy.is_enabled() and routes.STATE.enabled and routes.STATE.why is None
    assert pins.config()["policy"] == "lru" and pins.config()["headroom"] == str(3 << 30)
    assert pins.config_sources()["policy"] == "configure()"
    s = routes.stats_json()
    assert s["comfy"]["enabled"] and s["config"]["policy"] == {"value": "lru", "source": "configure()"}
    assert s["settings"]["values"] == {"pins.Policy": "lru", "pins.CpuTargets": True, "pins.Headroom": "3G"}
    assert s["settings"]["next_start"] == []

    # From the dialog: live where pins allows, else at the next start.
    answer = routes.apply_settings({"pins.Policy": "trace"})
    assert answer["applied"] == "policy:trace" and answer["config"]["policy"]["value"] == "trace"
    assert pins.config()["policy"] == "trace"
    answer = routes.apply_settings({"pins.Share": True})
    assert answer == {**answer, "applied": "", "next_start": ["pins.Share"]}
    _settings(comfy_host, **{"pins.Share": True})
    assert routes.stats_json()["settings"]["next_start"] == ["pins.Share"]
    assert routes.apply_settings({"pins.Headroom": ""})["next_start"] == ["pins.Headroom"]  # configured: kept
    for bad, named in [({"pins.Policy": "fifo"}, "pins.Policy must be one of default, trace, mru, lru, reuse, "
                                                 "got 'fifo'"),
                       ({"pins.Headroom": "lots"}, "headroom"), ({"pins.Enabled": "yes"}, "pins.Enabled"),
                       ({"pins.Bogus": 1}, "unknown setting 'pins.Bogus'"), ([], "JSON object")]:
        with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
            routes.apply_settings(bad)
    assert pins.config()["policy"] == "trace"  # a refused setting applied nothing


def test_node_off_in_the_settings_installs_nothing(comfy_host, caplog):
    import torch_pins.comfy

    _settings(comfy_host, **{"pins.Enabled": False})
    with caplog.at_level(logging.INFO, logger="torch_pins.comfy"):
        _, routes = _load_node()
    assert not torch_pins.comfy.is_enabled()
    lines = [r.getMessage() for r in caplog.records if r.name == "torch_pins.comfy"]
    assert lines == ["pins: settings: off in ComfyUI's settings (pins.Enabled); ComfyUI runs without pins."]
    s = routes.stats_json()
    assert s["comfy"]["enabled"] is False and s["comfy"]["why"].startswith("settings: off")


# The node loaded as ComfyUI loads it, in a process of its own, with torch_pins
# hidden or made not to load; prints its log and the route's answer.
DRIVER = r"""
import importlib.abc, importlib.util, json, logging, os, sys
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s", stream=sys.stdout)
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch_pins":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
if sys.argv[2] == "missing":
    sys.meta_path.insert(0, Hide())
path = sys.argv[1]
spec = importlib.util.spec_from_file_location(path.replace(".", "_x_"), os.path.join(path, "__init__.py"))
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
print("NODES", module.NODE_CLASS_MAPPINGS)
print("STATS", json.dumps(sys.modules[spec.name + ".routes"].stats_json()))
"""


def _run_node(how, **env):
    full = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_bindings"), **env)
    full.pop("PINS_CONF", None)
    out = subprocess.run([sys.executable, "-c", DRIVER, NODE, how], capture_output=True, text=True, env=full)
    assert out.returncode == 0, out.stdout + out.stderr
    logs = [line[4:] for line in out.stdout.splitlines() if line.startswith("LOG ")]
    stats = json.loads(next(line[6:] for line in out.stdout.splitlines() if line.startswith("STATS ")))
    return logs, stats, out


def test_node_without_torch_pins_says_so_in_one_line_and_loads():
    logs, stats, out = _run_node("missing")
    assert len(logs) == 1, logs
    assert logs[0].startswith("torch_pins.comfy pins: missing: torch-pins is not installed in this ComfyUI's "
                              f"Python ({sys.executable}); install it with `{sys.executable} -m pip install "
                              "torch-pins`"), logs
    assert "NODES {}" in out.stdout and out.stderr == ""
    assert stats == {"enabled": False, "why": logs[0].split("pins: ", 1)[1]}


def test_node_with_a_torch_pins_built_for_another_torch_says_so_in_one_line(tmp_path):
    lib = tmp_path / "libpins.so"
    lib.write_bytes(b"")
    (tmp_path / "libpins.so.torch").write_text("2.11.0\n")
    logs, stats, out = _run_node("mismatch", PINS_LIBRARY=str(lib))
    assert len(logs) == 1, logs
    assert logs[0].startswith(f"torch_pins.comfy pins: mismatch: torch-pins does not load into this ComfyUI "
                              f"({lib} was built against torch 2.11.0, not this torch's release."), logs
    assert "pins: pins:" not in logs[0] and logs[0].endswith("ComfyUI runs without pins.")
    assert stats["enabled"] is False and stats["why"].startswith("mismatch: ")


def test_usage_sample_info_line_says_the_policy_pins_logs():
    """docs/USAGE.md's sample of enable()'s INFO line has the default policy,
    the one a ComfyUI without PINS_CONF logs."""
    import re

    usage = open(os.path.join(ROOT, "docs", "USAGE.md")).read()
    sample = re.search(r"^torch_pins \S+: active in ComfyUI .*; policy (\w+),", usage, re.M)
    assert sample, "USAGE.md has no sample INFO line"
    out = cli("stats", "--json")
    policy = json.loads(out.stdout)["config"]["policy"]
    assert policy["source"] == "default" and sample.group(1) == policy["value"], (sample.group(0), policy)
