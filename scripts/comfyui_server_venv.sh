#!/usr/bin/env bash
# Makes what tests/python/test_comfy_browser.py needs to run ComfyUI as a server
# on the CPU and watch pins' panel in a browser. A developer's step, not CI's
# (CI has no ComfyUI checkout, and the test skips, naming what is missing).
#
#   scripts/comfyui_server_venv.sh COMFYUI VENV
#
# COMFYUI  a ComfyUI checkout (scripts/comfyui_checkout.sh makes one)
# VENV     where the server's venv goes (it must not exist yet)
#
# ComfyUI's server imports torchvision, which does not load beside the CPU
# torch 2.13.0 of .venv: VENV gets torch 2.14.1 and torchvision 0.29.1 (a CUDA
# build that runs on the CPU), ComfyUI's requirements.txt without torch,
# torchvision and torchaudio, and torch-pins from this tree, built for that
# torch (scripts/build_release.sh) and installed editable, so no second CMake
# run. comfy-cli, which packs the node as the Comfy registry takes it, goes
# into VENV-cli, a venv of its own; Playwright into .venv (the test's Python);
# Debian's chromium where it is missing (Playwright's own browser download is
# not used).
set -euo pipefail
if [ $# -ne 2 ]; then
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
comfyui=$(cd "$1" && pwd)
venv=$2
root=$(cd "$(dirname "$0")/.." && pwd)
[ -e "$venv" ] && { echo "comfyui_server_venv: $venv exists already" >&2; exit 1; }
python3 -m venv "$venv"
venv=$(cd "$venv" && pwd)
grep -v -E '^(torch|torchvision|torchaudio)([<>=~ ].*)?$' "$comfyui/requirements.txt" >"$venv/comfyui-requirements.txt"
"$venv/bin/pip" install --quiet torch==2.14.1 torchvision==0.29.1 -r "$venv/comfyui-requirements.txt" \
    scikit-build-core
bash "$root/scripts/build_release.sh" "$venv/bin/python"
"$venv/bin/pip" install --quiet --no-build-isolation -e "$root/python_bindings"
python3 -m venv "$venv-cli"
"$venv-cli/bin/pip" install --quiet comfy-cli
"$root/.venv/bin/python" -m pip install --quiet playwright
if ! command -v chromium >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium
fi
echo "run: COMFYUI_PATH=$comfyui PINS_COMFY_PYTHON=$venv/bin/python PINS_COMFY_CLI=$venv-cli/bin/comfy" \
     "$root/.venv/bin/python -m pytest tests/python/test_comfy_browser.py"
