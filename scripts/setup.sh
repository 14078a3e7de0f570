#!/usr/bin/env bash
# One-time set-up of a fresh machine of this project's kind; re-running is cheap.
# Installs the Debian packages the build needs, then a .venv with torch and the
# Python test dependencies. Each step is skipped when its result is already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# clang and its runtimes (libFuzzer, sanitizers): the short fuzz run of
# scripts/test.sh (scripts/fuzz.sh), make sanitize and the thread-safety
# analysis. The other platforms' tools (mingw-w64 and wine, HIP's headers) are
# installed by their own checks when make test-platforms first runs them
# (scripts/check_windows.sh, scripts/check_hip.sh).
apt_pkgs=(cmake ninja-build g++ libgtest-dev nlohmann-json3-dev clang libclang-rt-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

stamp=.venv/.pins-setup-stamp
req=python_bindings/requirements-dev.txt
if [ ! -f "$stamp" ] || [ "$req" -nt "$stamp" ] || [ python_bindings/pyproject.toml -nt "$stamp" ]; then
  echo "setup: creating .venv (torch from local wheels)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # --no-compile: byte-compiling all of torch at install takes longer than the
  # few modules a run imports take to compile on first import.
  .venv/bin/pip install -q --no-compile -r "$req"
  # The torch_pins package, editable: imported in place from python_bindings/, it
  # loads the libpins.so the build copies into it. No CMake run here (pyproject.toml,
  # the editable override): the library is built once, into build/.
  .venv/bin/pip install -q --no-deps --no-build-isolation -e python_bindings
  touch "$stamp"
fi
