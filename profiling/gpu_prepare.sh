#!/usr/bin/env bash
# Run here before profiling/gpu_check.sh: copies what the GPU machine lacks into
# .gpu-deps/ (ignored by git; name it in the device call's carry list).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps
[ -d /usr/src/googletest ] || { echo "install libgtest-dev (make setup) first" >&2; exit 1; }
rm -rf .gpu-deps/googletest && cp -r /usr/src/googletest .gpu-deps/googletest
echo "prepared .gpu-deps/googletest"
