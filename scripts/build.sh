#!/usr/bin/env bash
# Configures (once) and builds everything into build/ (executables in build/bin).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ ! -f build/build.ninja ]; then
  prefix=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
fi
cmake --build build
