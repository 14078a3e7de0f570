#!/usr/bin/env bash
# Runs every test: GoogleTest through ctest, then pytest; ends with one summary line.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p build/test-results
rm -f build/test-results/*.xml
(cd build && ctest --output-on-failure --output-junit test-results/ctest.xml -j2) 
ctest_rc=$?
.venv/bin/python -m pytest -q tests/python --junitxml=build/test-results/pytest.xml
pytest_rc=$?
.venv/bin/python scripts/summarize_tests.py build/test-results/ctest.xml build/test-results/pytest.xml
sum_rc=$?
[ $ctest_rc -eq 0 ] && [ $pytest_rc -eq 0 ] && [ $sum_rc -eq 0 ]
