#!/usr/bin/env bash
# Run here before profiling/gpu_check.sh: copies what the GPU machine lacks into
# .gpu-deps/ (ignored by git; name it in the device call's carry list).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps
[ -d /usr/src/googletest ] || { echo "install libgtest-dev (make setup) first" >&2; exit 1; }
rm -rf .gpu-deps/googletest && cp -r /usr/src/googletest .gpu-deps/googletest
# nlohmann-json's headers (the safetensors reader in the core needs them).
[ -f /usr/include/nlohmann/json.hpp ] || { echo "install nlohmann-json3-dev (make setup) first" >&2; exit 1; }
rm -rf .gpu-deps/nlohmann && mkdir -p .gpu-deps/nlohmann && cp -r /usr/include/nlohmann .gpu-deps/nlohmann/
# diffusers, for the benchmarks that compare with its offload modes (the GPU
# image has its other needs, Python 3.12: /work/.library/device/KINDS.md).
rm -rf .gpu-deps/wheels && mkdir -p .gpu-deps/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  -d .gpu-deps/wheels diffusers==0.42.1
echo "prepared .gpu-deps/googletest, .gpu-deps/nlohmann and .gpu-deps/wheels"
