#!/usr/bin/env bash
# The libFuzzer targets of fuzz/ (fuzz/README.md): builds them with clang++ in
# build-fuzz/ (torch-free, ASan+UBSan, coverage-instrumented) and runs each for
# SECONDS (default 20), printing its exec count. New inputs go to
# build-fuzz/corpus/<target>/; the seeds in fuzz/corpus/<target>/ are only read.
# A crash leaves its input in build-fuzz/ (crash-*) and fails the script.
# With PINS_FUZZ_JUNIT=FILE it also writes a JUnit report, one test case per
# target (scripts/test.sh counts it in its summary line).
#   scripts/fuzz.sh [SECONDS] [TARGET...]   targets: config size safetensors trace (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
secs=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config size safetensors trace)
dir=${PINS_FUZZ_DIR:-build-fuzz}
junit=${PINS_FUZZ_JUNIT:-}
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ is needed (libFuzzer); Debian: apt-get install clang libclang-rt-dev" >&2
  exit 1
fi
# -g1 as in scripts/build.sh: the sanitizers' reports keep file and line (78 -> 62 s here).
# PINS_UNITY_BUILD: the core and the simulator compiled as unity builds (CMakeLists.txt).
[ -f "$dir/build.ninja" ] || CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DPINS_WITH_TORCH=OFF -DPINS_BUILD_TESTS=OFF -DPINS_BUILD_PROFILING=ON -DPINS_BUILD_FUZZ=ON \
  -DPINS_WITH_CUDA=OFF -DPINS_NVTX=OFF -DPINS_UNITY_BUILD=ON >/dev/null
cmake --build "$dir" --target "${targets[@]/#/pins_fuzz_}"
status=0
cases=()
for t in "${targets[@]}"; do
  start=$(date +%s.%N)
  mkdir -p "$dir/corpus/$t"
  log="$dir/fuzz_$t.log"
  max_len=4096
  [ "$t" = trace ] && max_len=16384
  [ "$t" = safetensors ] && max_len=8192
  if "$dir/bin/pins_fuzz_$t" -max_total_time="$secs" -print_final_stats=1 -max_len="$max_len" \
       -dict="fuzz/$t.dict" -artifact_prefix="$dir/" "$dir/corpus/$t" "fuzz/corpus/$t" > "$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    units=$(ls "$dir/corpus/$t" | wc -l)
    echo "fuzz $t: ok, $execs inputs in ${secs} s ($rate/s), $units new corpus entries (log: $log)"
    cases+=("<testcase classname=\"fuzz\" name=\"$t\" time=\"$(awk "BEGIN { print $(date +%s.%N) - $start }")\"/>")
  else
    echo "fuzz $t: FAILED (log: $log)"
    grep -E "ERROR|fuzz property|Test unit written|SUMMARY|==[0-9]+==" "$log" | head -20
    cases+=("<testcase classname=\"fuzz\" name=\"$t\"><failure message=\"crash or sanitizer report: $log\"/></testcase>")
    status=1
  fi
done
if [ -n "$junit" ]; then
  { echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuite name=\"fuzz\" tests=\"${#cases[@]}\">"
    printf '%s\n' "${cases[@]}"
    echo '</testsuite>'; } > "$junit"
fi
exit $status
