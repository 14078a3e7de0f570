#!/usr/bin/env bash
# The hip backend (csrc/pool/backend_hip.cpp) on a machine without an AMD GPU:
# installs HIP's headers and libamdhip64 when missing (Debian libamdhip64-dev,
# ROCm 5.2), builds the torch-free core with PINS_WITH_HIP=ON in build-hip/ and
# runs the backend contract tests (tests/csrc/pool/backend_test.cpp) on it:
# reserve, release, commit and decommit run, lock and unlock skip ("no HIP
# device"). Only pins_backend_tests is built, so a rerun takes seconds.
#
# Fails (exit 1) when backend_hip.cpp stops compiling, when the hip backend was
# built without HIP after all, or when a test fails. Exits 77, saying so, when
# HIP cannot be installed here (no network, not Debian): skipped, never passed.
# With PINS_HIP_JUNIT=FILE it writes a JUnit report, the build as one case and
# each test as one (scripts/test.sh counts it in its summary line).
#   scripts/check_hip.sh        PINS_HIP_DIR: the build tree (default build-hip)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${PINS_HIP_DIR:-build-hip}
junit=${PINS_HIP_JUNIT:-}
start=$(date +%s)

xml_escape() { sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g' <<< "$1"; }

# The report: the build's case, then ctest's suite when the tests ran.
write_junit() {  # CASE_BODY_XML [CTEST_JUNIT]
  [ -n "$junit" ] || return 0
  mkdir -p "$(dirname "$junit")"
  { echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo '<testsuites>'
    echo "<testsuite name=\"hip\" tests=\"1\">"
    echo "<testcase classname=\"hip\" name=\"build\" time=\"$(($(date +%s) - start))\">$1</testcase>"
    echo '</testsuite>'
    [ -n "${2:-}" ] && [ -f "$2" ] && grep -v '^<?xml' "$2"
    echo '</testsuites>'; } > "$junit"
}

fail() {
  echo "check_hip: FAILED: $1" >&2
  write_junit "<failure message=\"$(xml_escape "$1")\"/>" "${2:-}"
  exit 1
}

have_hip() {
  local d
  for d in "${ROCM_PATH:-}" /opt/rocm /usr; do
    [ -n "$d" ] && [ -f "$d/include/hip/hip_runtime_api.h" ] && return 0
  done
  return 1
}

# HIP's host API only: no hipcc, no ROCm device libraries (CMakeLists.txt says why).
if ! have_hip; then
  echo "check_hip: installing Debian package: libamdhip64-dev"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  if ! { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq \
           libamdhip64-dev >/dev/null; } || ! have_hip; then
    why="HIP's headers and libamdhip64 are not installed and could not be (apt-get install libamdhip64-dev failed: no network, or not Debian); backend_hip.cpp was NOT compiled"
    echo "check_hip: SKIPPED: $why" >&2
    write_junit "<skipped message=\"$(xml_escape "$why")\"/>"
    exit 77
  fi
fi

mkdir -p "$dir"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPINS_WITH_TORCH=OFF -DPINS_WITH_HIP=ON \
  -DPINS_WITH_CUDA=OFF -DPINS_NVTX=OFF -DPINS_BUILD_PROFILING=OFF > "$dir/configure.log" 2>&1 \
  || { tail -20 "$dir/configure.log" >&2; fail "configuring $dir with PINS_WITH_HIP=ON (log: $dir.configure.log)"; }
log="$dir/build.log"
if ! cmake --build "$dir" -j "${PINS_HIP_JOBS:-2}" --target pins_backend_tests > "$log" 2>&1; then
  grep -E "error|Error" "$log" | head -30 >&2
  fail "building pins_backend_tests with PINS_WITH_HIP=ON (log: $log)"
fi
# The stub (no PINS_WITH_HIP) would compile too: the test binary must call HIP.
# nm's whole output first: `nm | grep -q` fails under pipefail once grep stops
# reading early and nm dies of SIGPIPE (a long symbol list).
undefined=$(nm -u "$dir/bin/pins_backend_tests") || fail "nm -u $dir/bin/pins_backend_tests failed"
grep -q hipHostRegister <<<"$undefined" \
  || fail "backend_hip.cpp was compiled without HIP: pins_backend_tests does not call hipHostRegister"

results="$root/$dir/test-results/ctest.xml"
rm -f "$results"
(cd "$dir" && ctest -R 'HostBackend' --output-on-failure --output-junit "$results") > "$dir/ctest.log" 2>&1
ctest_rc=$?
# The hip cases that ran and those that skipped: the mmap layer's must run
# without a device (only the lock cases may skip).
read -r ran skipped < <(python3 - "$results" <<'PY' 2>/dev/null
import re, sys
import xml.etree.ElementTree as ET
ran = skipped = 0
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if not re.search(r"/hip\b", case.get("name", "")):
        continue
    if case.get("status") == "run" and case.find("skipped") is None:
        ran += 1
    else:
        skipped += 1
print(ran, skipped)
PY
)
if [ $ctest_rc -ne 0 ]; then
  tail -40 "$dir/ctest.log" >&2
  fail "the backend contract tests failed on the hip build (log: $dir/ctest.log)" "$results"
elif [ "${ran:-0}" -lt 3 ]; then
  fail "only ${ran:-0} hip contract tests ran; reserve, commit and decommit must run without a device" "$results"
fi
write_junit "" "$results"
why=""; [ "${skipped:-0}" -gt 0 ] && why=" (lock and unlock: no HIP device here)"
echo "check_hip: ok in $(($(date +%s) - start)) s: $(grep -E 'tests passed' "$dir/ctest.log");" \
  "hip: $ran cases ran, $skipped skipped$why (log: $dir/ctest.log)"
