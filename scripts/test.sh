#!/usr/bin/env bash
# make test: every test of this platform (Linux x86-64, the torch of .venv): the
# folder-graph check, GoogleTest through ctest, pytest (again with shared pins
# for the suites they change) and a short fuzz run; ends with one summary line.
# The builds for other platforms and torch releases are scripts/test_platforms.sh
# (make test-platforms).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p build/test-results
# Each step's wall time, printed as it ends ("time <step>: N s"), so a slow CI run
# says where its minutes went.
step_start=$SECONDS
took() { echo "time $1: $((SECONDS - step_start)) s"; step_start=$SECONDS; }
rm -f build/test-results/{ctest,pytest,pytest-share,fuzz}.xml
# The folder graph of the C++ sources: no cycle, no torch header in the core, no
# source file past its line limit (docs/DESIGN.md, "Layers"); tests/python/test_layers.py
# counts it in the summary.
python3 scripts/check_layers.py
layers_rc=$?
took "layers"
(cd build && ctest --output-on-failure --output-junit test-results/ctest.xml -j2)
ctest_rc=$?
took "ctest"
# CI (.ci/run) builds the sanitizer trees of make sanitize meanwhile, at a low
# priority: pytest mostly waits on one Python process, and the timed C++ tests
# above are done. The build runs on past make test, through make
# test-platforms' installs, and holds build/.sanitize-prebuild.lock until it
# ends: make sanitize waits for the lock, runs the tests and builds again what
# failed here.
if [ -n "${PINS_PREBUILD_SANITIZERS:-}" ]; then
  # The lock is taken here, before the build starts, and held by the build's
  # processes (they inherit the descriptor; this shell closes its own).
  exec 8>build/.sanitize-prebuild.lock
  flock 8
  nice -n 15 bash scripts/sanitize.sh --build-only > build/test-results/sanitize-prebuild.log 2>&1 &
  exec 8>&-
fi
# pytest on every core, each test file whole on one worker (-n auto --dist
# loadfile): a file's tests share their module's fixtures and processes.
# The install from the source package (tests/python/test_install.py: a native
# build of its own, 3-4 minutes) is make test-platforms'; the release wheel of
# this build is checked here in short form (tests/python/test_wheel_install.py).
xdist="-n ${PINS_TEST_WORKERS:-auto} --dist loadfile"
.venv/bin/python -m pytest -q $xdist tests/python --ignore=tests/python/test_install.py \
  --junitxml=build/test-results/pytest.xml
pytest_rc=$?
took "pytest"
# The suites shared pins change (docs/DESIGN.md "Shared pins"), again with
# share:true: every pin of a load_file tensor then lives in a shared segment.
share_root=$(mktemp -d "$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )/pins-test-share-XXXXXX")
PINS_CONF="share:true,share_dir:$share_root" .venv/bin/python -m pytest -q $xdist tests/python/test_load_file.py \
  tests/python/test_cast_to_device.py tests/python/test_gathered.py tests/python/test_comfy_standins.py \
  tests/python/test_reliability.py tests/python/test_contract.py tests/python/test_fast_path.py \
  tests/python/test_bad_input.py tests/python/test_subclass.py tests/python/test_opcheck.py \
  --junitxml=build/test-results/pytest-share.xml -o junit_suite_name=pytest-share
share_rc=$?
# The last process out removes the share's directory: none is left behind.
if [ -n "$(ls -A "$share_root")" ]; then echo "shared pins left files in $share_root"; share_rc=1; fi
rm -rf "$share_root"
took "pytest share"
# A short fuzz run (fuzz/README.md): 5 s per libFuzzer target, built with clang
# into build-fuzz/; a crash fails the run and is counted in the summary.
PINS_FUZZ_JUNIT=build/test-results/fuzz.xml bash scripts/fuzz.sh "${PINS_FUZZ_SECONDS:-5}"
fuzz_rc=$?
took "fuzz"
.venv/bin/python scripts/summarize_tests.py build/test-results/ctest.xml build/test-results/pytest.xml \
  build/test-results/pytest-share.xml build/test-results/fuzz.xml
sum_rc=$?
[ $layers_rc -eq 0 ] && [ $ctest_rc -eq 0 ] && [ $pytest_rc -eq 0 ] && [ $share_rc -eq 0 ] && [ $fuzz_rc -eq 0 ] \
  && [ $sum_rc -eq 0 ]
