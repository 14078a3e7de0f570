#!/usr/bin/env bash
# The torch-free core on Windows (README, "Windows"): cross-compiles the core
# and its torch-free test programs with mingw-w64 into build-win/ (GoogleTest
# built from /usr/src/googletest with the same toolchain, everything linked
# statically) and runs them under wine, each writing a GoogleTest XML report.
# Fails when the Windows build does not compile or a test fails; when mingw-w64
# or wine is missing and cannot be installed it says so and counts as skipped.
# With PINS_WINDOWS_JUNIT=FILE it also writes one JUnit report of it all
# (scripts/test.sh counts it in its summary line).
#   scripts/check_windows.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=build-win
junit=${PINS_WINDOWS_JUNIT:-$dir/test-results/windows.xml}
programs=(pins_core_tests pins_sysmem_tests pins_sim_tests)
results=$dir/test-results
start=$(date +%s)
mkdir -p "$results" "$(dirname "$junit")"
rm -f "$results"/*.xml

# One JUnit report: the programs' own reports, and a "windows" suite with a
# case per step that failed or was skipped (a build error, a program that
# crashed before writing its report, missing tools).
write_junit() {  # status: ok | skipped | failed; message
  python3 - "$junit" "$1" "$2" "$results" "${programs[@]}" <<'EOF'
import os, sys
import xml.etree.ElementTree as ET
out, status, message, results, programs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
top = ET.Element("testsuites", name="windows")
for p in programs:
    path = os.path.join(results, p + ".xml")
    if os.path.exists(path):
        for suite in ET.parse(path).getroot().iter("testsuite"):
            suite.set("name", "windows." + suite.get("name", ""))
            top.append(suite)
if status != "ok":
    suite = ET.SubElement(top, "testsuite", name="windows")
    case = ET.SubElement(suite, "testcase", classname="windows", name="check_windows")
    ET.SubElement(case, "skipped" if status == "skipped" else "failure", message=message)
ET.ElementTree(top).write(out, encoding="UTF-8", xml_declaration=True)
EOF
}

skip() {
  echo "windows: SKIPPED: $1" >&2
  write_junit skipped "$1"
  exit 0
}

fail() {
  echo "windows: FAILED: $1" >&2
  write_junit failed "$1"
  exit 1
}

# ---------------------------------------------------------------- tools
wine_bin() {
  if command -v wine64 >/dev/null 2>&1; then command -v wine64
  elif [ -x /usr/lib/wine/wine64 ]; then echo /usr/lib/wine/wine64
  elif command -v wine >/dev/null 2>&1; then command -v wine
  fi
}
have_tools() {
  command -v x86_64-w64-mingw32-g++-posix >/dev/null 2>&1 && [ -n "$(wine_bin)" ] &&
    [ -f /usr/src/googletest/CMakeLists.txt ] && [ -f /usr/include/nlohmann/json.hpp ]
}
if ! have_tools; then
  pkgs=(g++-mingw-w64-x86-64-posix wine64 libgtest-dev nlohmann-json3-dev)
  echo "windows: installing ${pkgs[*]} (scripts/setup.sh installs them too)"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo -n"
  { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq \
      --no-install-recommends "${pkgs[@]}"; } >"$dir/apt.log" 2>&1
  have_tools || skip "mingw-w64 (x86_64-w64-mingw32-g++-posix) or wine64 is missing and could not be installed (see $dir/apt.log)"
fi
wine=$(wine_bin)

# ---------------------------------------------------------------- build
# nlohmann-json is header-only: the cross build sees its headers alone (never
# the rest of /usr/include, whose glibc headers would shadow mingw's), through a
# package of its own that find_package(nlohmann_json) finds.
mkdir -p "$dir/include" "$dir/nlohmann-package"
ln -sfn /usr/include/nlohmann "$dir/include/nlohmann"
cat > "$dir/nlohmann-package/nlohmann_jsonConfig.cmake" <<EOF
if(NOT TARGET nlohmann_json::nlohmann_json)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$root/$dir/include")
endif()
EOF
cat > "$dir/nlohmann-package/nlohmann_jsonConfigVersion.cmake" <<'EOF'
set(PACKAGE_VERSION 3)
set(PACKAGE_VERSION_COMPATIBLE TRUE)
EOF
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# -O1: about a third less compile time than -O3 on a check that compiles for
# minutes and runs for seconds; PINS_UNITY_BUILD (CMakeLists.txt) saves more.
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64.cmake -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DPINS_WITH_TORCH=OFF -DPINS_WITH_CUDA=OFF -DPINS_NVTX=OFF -DPINS_BUILD_PROFILING=ON -DPINS_UNITY_BUILD=ON \
    -DPINS_GTEST_SOURCE=/usr/src/googletest -Dnlohmann_json_DIR="$root/$dir/nlohmann-package" \
    >"$dir/configure.log" 2>&1 || fail "cmake could not configure the Windows build (see $dir/configure.log)"
fi
# pins-bench is Linux's (O_DIRECT, /proc): only the test programs are built.
if ! cmake --build "$dir" -j"${PINS_WINDOWS_JOBS:-2}" --target "${programs[@]}" >"$dir/build.log" 2>&1; then
  grep -E "error|Error" "$dir/build.log" | head -20 >&2
  fail "the Windows build does not compile (see $dir/build.log)"
fi
built=$(date +%s)

# ---------------------------------------------------------------- run
export WINEPREFIX="$root/$dir/wine" WINEDEBUG=-all
status=0
crashed=()
for p in "${programs[@]}"; do
  # A path relative to the working directory: wine reads it on its Z: drive.
  timeout "${PINS_WINDOWS_TIMEOUT:-300}" "$wine" "$dir/bin/$p.exe" --gtest_output="xml:$results/$p.xml" \
    >"$results/$p.log" 2>&1
  rc=$?
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$results/$p.log" | sed 's/, listed below://' |
    tr -s ' []' ' ' | tr '\n' ';')
  echo "windows $p: exit $rc;$summary log $results/$p.log"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E '^\[  FAILED  \]' "$results/$p.log" | head -20 >&2
    # No report, or one with no failure in it: the program crashed (or timed out).
    grep -qs '<failure' "$results/$p.xml" || crashed+=("$p (exit $rc)")
  fi
done
end=$(date +%s)
if [ ${#crashed[@]} -gt 0 ]; then
  write_junit failed "ended with no failing test reported: ${crashed[*]}"
else
  write_junit ok ""
fi
python3 scripts/summarize_tests.py "$junit" | sed "s/^tests:/windows ($("$wine" --version 2>/dev/null)):/"
echo "windows: build $((built - start)) s, tests $((end - built)) s under wine"
exit $status
