#!/usr/bin/env bash
# Runs every test: the include-graph check, GoogleTest through ctest, pytest, the
# second torch release, a short fuzz run, the hip backend's check, then the
# core's tests built for Windows and run under wine; ends with one summary line.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p build/test-results
# Each step's wall time, printed as it ends ("time <step>: N s"), so a slow CI run
# says where its minutes went.
step_start=$SECONDS
took() { echo "time $1: $((SECONDS - step_start)) s"; step_start=$SECONDS; }
rm -f build/test-results/*.xml
# The folder graph of the C++ sources: no cycle, no torch header in the core
# (docs/DESIGN.md, "Layers"); tests/python/test_layers.py counts it in the summary.
python3 scripts/check_layers.py
layers_rc=$?
took "layers"
(cd build && ctest --output-on-failure --output-junit test-results/ctest.xml -j2) 
ctest_rc=$?
took "ctest"
# CI (.ci/run) builds the sanitizer trees of make sanitize meanwhile, at a low
# priority: pytest mostly waits on one Python process, and the timed C++ tests
# above are done. Their result shows in make sanitize, which builds again what
# failed here.
prebuild=""
if [ -n "${PINS_PREBUILD_SANITIZERS:-}" ]; then
  nice -n 15 bash scripts/sanitize.sh --build-only > build/test-results/sanitize-prebuild.log 2>&1 &
  prebuild=$!
fi
.venv/bin/python -m pytest -q tests/python --junitxml=build/test-results/pytest.xml
pytest_rc=$?
took "pytest"
# The suites shared pins change (docs/DESIGN.md "Shared pins"), again with
# share:true: every pin of a load_file tensor then lives in a shared segment.
share_root=$(mktemp -d "$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )/pins-test-share-XXXXXX")
PINS_CONF="share:true,share_dir:$share_root" .venv/bin/python -m pytest -q tests/python/test_load_file.py \
  tests/python/test_cast_to_device.py tests/python/test_gathered.py tests/python/test_comfy_standins.py \
  tests/python/test_reliability.py tests/python/test_contract.py tests/python/test_fast_path.py \
  tests/python/test_bad_input.py tests/python/test_subclass.py tests/python/test_opcheck.py \
  --junitxml=build/test-results/pytest-share.xml -o junit_suite_name=pytest-share
share_rc=$?
# The last process out removes the share's directory: none is left behind.
if [ -n "$(ls -A "$share_root")" ]; then echo "shared pins left files in $share_root"; share_rc=1; fi
rm -rf "$share_root"
took "pytest share"
# A second torch release in short form (docs/RELEASES.md): the torch layer built
# for torch 2.14.1 and the op's tests run under it.
bash scripts/check_release.sh build/test-results/pytest-torch-2.14.xml
release_rc=$?
took "torch 2.14"
# A short fuzz run (fuzz/README.md): 5 s per libFuzzer target, built with clang
# into build-fuzz/; a crash fails the run and is counted in the summary.
PINS_FUZZ_JUNIT=build/test-results/fuzz.xml bash scripts/fuzz.sh "${PINS_FUZZ_SECONDS:-5}"
fuzz_rc=$?
took "fuzz"
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
if [ -n "$prebuild" ]; then
  wait "$prebuild" || echo "sanitizer prebuild failed (log: build/test-results/sanitize-prebuild.log)"
  took "waiting for the sanitizer prebuild"
fi
.venv/bin/python scripts/summarize_tests.py build/test-results/ctest.xml build/test-results/pytest.xml \
  build/test-results/pytest-share.xml \
  build/test-results/fuzz.xml build/test-results/pytest-torch-2.14.xml build/test-results/hip.xml \
  build/test-results/windows.xml
sum_rc=$?
[ $layers_rc -eq 0 ] && [ $ctest_rc -eq 0 ] && [ $pytest_rc -eq 0 ] && [ $share_rc -eq 0 ] && [ $release_rc -eq 0 ] && [ $fuzz_rc -eq 0 ] \
  && [ $hip_rc -eq 0 ] && [ $windows_rc -eq 0 ] && [ $sum_rc -eq 0 ]
