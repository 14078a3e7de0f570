#!/usr/bin/env bash
# Prints the results table of docs/SIMULATOR.md: every bundled trace in
# profiling/traces/, every sequence, every policy, as markdown rows.
#   profiling/sim/results.sh [RUNS] [-- extra pins-sim arguments]
# PINS_SIM: the binary (default build/bin/pins-sim). PINS_SIM_PNG_DIR: when set,
# also draws one plot per trace there with profiling/sim/plot.py (matplotlib),
# run by $PYTHON (default: the checkout's .venv/bin/python, else python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sim=${PINS_SIM:-$root/build/bin/pins-sim}
runs=6
if [ $# -gt 0 ] && [ "$1" != "--" ]; then runs=$1; shift; fi
[ "${1:-}" = "--" ] && shift
if [ ! -x "$sim" ]; then
  echo "results.sh: $sim not found; build it with: cmake --build build --target pins-sim" >&2
  exit 1
fi
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python=$root/.venv/bin/python; else python=python3; fi
fi
cd "$root"
header=--markdown-header
for trace in profiling/traces/*.json; do
  "$sim" --trace "$trace" --sequence all --runs "$runs" "$header" "$@"
  header=--markdown
  if [ -n "${PINS_SIM_PNG_DIR:-}" ]; then
    mkdir -p "$PINS_SIM_PNG_DIR"
    "$sim" --trace "$trace" --sequence all --runs "$runs" --json "$@" |
      "$python" profiling/sim/plot.py - "$PINS_SIM_PNG_DIR/$(basename "$trace" .json).png"
  fi
done
