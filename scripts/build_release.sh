#!/usr/bin/env bash
# Builds the torch layer of pins (libpins.so and torch_pins._C) against the torch
# of the Python given as $1, into build-torch-MAJOR.MINOR/, and copies it into
# the package as python_bindings/torch_pins/_lib/torch-MAJOR.MINOR/ beside the
# builds for other releases (Note [One package, several torch releases] in
# python_bindings/torch_pins/_library.py). The same sources as make build; only
# the torch headers differ. Prints the folder it filled.
set -euo pipefail
py=${1:?usage: build_release.sh PYTHON (a python whose torch to build for)}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
release=$("$py" -c "import torch; print('.'.join(torch.__version__.split('+')[0].split('.')[:2]))")
dir=build-torch-$release
mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh "$py")
mkdir -p "$dir"
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "${torch_args[@]}" -DPINS_BUILD_TESTS=OFF -DPINS_BUILD_PROFILING=OFF \
    -DPINS_COPY_TO_PACKAGE=ON >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log" >&2; exit 1; }
fi
cmake --build "$dir" --target pins_python_lib >&2
echo "python_bindings/torch_pins/_lib/torch-$release"
