#!/usr/bin/env bash
# Builds the torch layer of pins (libpins.so and torch_pins._C) against the torch
# of the Python given as $1, into build-torch-MAJOR.MINOR-VARIANT/ (VARIANT: cpu,
# or cuN for a torch built with CUDA N), and copies it into the package as
# python_bindings/torch_pins/_lib/torch-MAJOR.MINOR-VARIANT/ beside the builds
# for other releases (Note [One package, several torch releases] in
# python_bindings/torch_pins/_library.py). The same sources as make build; only
# the torch headers differ; the CUDA backend is built for a CUDA torch only.
# Each further argument is a Python of another version (no torch needed): its
# headers build torch_pins._C against the same torch, in the build folder's
# python-X.Y/ (scripts/release.py installs them into the wheel). Prints the
# build folder.
set -euo pipefail
py=${1:?usage: build_release.sh PYTHON [OTHER_PYTHON...] (a python whose torch to build for)}
shift
abs() { case $1 in /*) echo "$1" ;; */*) echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" ;; *) command -v "$1" ;; esac; }
py=$(abs "$py")
others=()  # each the interpreter itself, not a launcher (pyenv's shims)
for other in "$@"; do others+=("$("$other" -c 'import sys; print(sys.executable)')"); done
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh "$py" --package)
release=$("$py" -c "import torch; print('.'.join(torch.__version__.split('+')[0].split('.')[:2]))")
variant=$(printf '%s\n' "${torch_args[@]}" | sed -n 's/^-DPINS_TORCH_VARIANT=//p')
dir=build-torch-$release-$variant
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DPINS_BUILD_TESTS=OFF -DPINS_BUILD_PROFILING=OFF -DPINS_PYTHON_EXTENSION=ON)
mkdir -p "$dir"
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" "${common[@]}" "${torch_args[@]}" -DPINS_COPY_TO_PACKAGE=ON >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log" >&2; exit 1; }
fi
cmake --build "$dir" --target pins_python_lib >&2
for other in "${others[@]}"; do
  version=$("$other" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  sub=$dir/python-$version
  mkdir -p "$sub"
  if [ ! -f "$sub/build.ninja" ]; then
    # This Python's headers; the torch (and its check) of $py.
    cmake -S . -B "$sub" "${common[@]}" "${torch_args[@]}" -DPython_EXECUTABLE="$other" \
      -DPINS_EXTENSION_TORCH_PYTHON="$py" -DPINS_COPY_TO_PACKAGE=OFF >"$sub/configure.log" 2>&1 ||
      { cat "$sub/configure.log" >&2; exit 1; }
  fi
  cmake --build "$sub" --target pins_python >&2
done
echo "$dir"
