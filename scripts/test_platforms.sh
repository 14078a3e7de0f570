#!/usr/bin/env bash
# make test-platforms: the builds for platforms and torch releases other than
# make test's: the torch layer built for a second torch release (2.14.1) and its
# op tests in short form, the hip (AMD GPU) backend compiled against ROCm 5.2 and
# contract-tested without a device, and the torch-free core cross-compiled for
# Windows and run under wine. Ends with one summary line.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p build/test-results
step_start=$SECONDS
took() { echo "time $1: $((SECONDS - step_start)) s"; step_start=$SECONDS; }
rm -f build/test-results/{pytest-torch-2.14,hip,windows}.xml
# A second torch release in short form (docs/RELEASES.md): the torch layer built
# for torch 2.14.1 and the op's tests run under it.
bash scripts/check_release.sh build/test-results/pytest-torch-2.14.xml
release_rc=$?
took "torch 2.14"
# The hip backend, compiled with HIP and contract-tested without an AMD GPU
# (scripts/check_hip.sh, in build-hip/). It exits 77 when HIP cannot be
# installed here; its report then counts the check as skipped, not passed.
PINS_HIP_JUNIT=build/test-results/hip.xml bash scripts/check_hip.sh
hip_rc=$?
took "hip"
[ $hip_rc -eq 77 ] && hip_rc=0
# The torch-free core and its tests cross-compiled with mingw-w64 into
# build-win/ and run under wine (README, "Windows"): a build error or a failed
# test fails the run; without mingw-w64 or wine it counts as one skipped test.
PINS_WINDOWS_JUNIT=build/test-results/windows.xml bash scripts/check_windows.sh
windows_rc=$?
took "windows"
.venv/bin/python scripts/summarize_tests.py build/test-results/pytest-torch-2.14.xml build/test-results/hip.xml \
  build/test-results/windows.xml
sum_rc=$?
[ $release_rc -eq 0 ] && [ $hip_rc -eq 0 ] && [ $windows_rc -eq 0 ] && [ $sum_rc -eq 0 ]
