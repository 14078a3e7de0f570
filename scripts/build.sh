#!/usr/bin/env bash
# Configures (once) and builds into build/ (executables in build/bin): every
# target, or only the targets named as arguments (make demo names what it runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# Configured again where a tree predates the Python_EXECUTABLE argument (torch_pins._C).
if [ ! -f build/build.ninja ] || ! grep -q '^Python_EXECUTABLE:' build/CMakeCache.txt; then
  mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh .venv/bin/python)
  cmake -S . -B build -G Ninja "${torch_args[@]}" >/dev/null
fi
cmake --build build ${1:+--target "$@"}
