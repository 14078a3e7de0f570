#!/usr/bin/env bash
# Configures (once) and builds into build/ (executables in build/bin): every
# target, or only the targets named as arguments (make demo names what it runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# Configured again where a tree predates the Python_EXECUTABLE argument (torch_pins._C).
if [ ! -f build/build.ninja ] || ! grep -q '^Python_EXECUTABLE:' build/CMakeCache.txt; then
  mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh .venv/bin/python)
  # -g1, not RelWithDebInfo's -g: line tables only (backtraces, sanitizer
  # reports, perf and Nsight keep file and line), no variables' debug info,
  # which the files that include ATen spend a third of their compile time on.
  # The whole build on a fresh clone here (2 cores): 182 s against 273 s. For a
  # debugger, configure build/ yourself with -DCMAKE_BUILD_TYPE=Debug.
  cmake -S . -B build -G Ninja "${torch_args[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
fi
cmake --build build ${1:+--target "$@"}
