#!/usr/bin/env bash
# The torch-free core's tests under AddressSanitizer+UBSan and ThreadSanitizer,
# in build-asan/ and build-tsan/, then Clang's thread-safety analysis of the
# core's lock annotations (csrc/base/thread_safety.h, Note [Lock order]) in
# build-tsa/ (no torch needed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
status=0
for kind in asan tsan; do
  case $kind in
    asan) flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" ;;
    tsan) flags="-fsanitize=thread" ;;
  esac
  dir=build-$kind
  [ -f "$dir/build.ninja" ] || cmake -S . -B "$dir" -G Ninja -DPINS_WITH_TORCH=OFF -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="$flags -O1" >/dev/null
  cmake --build "$dir" --target pins_core_tests pins_sysmem_tests pins_sim_tests
  for t in pins_core_tests pins_sysmem_tests pins_sim_tests; do
    if "$dir/bin/$t" --gtest_brief=1 > "$dir/$t.log" 2>&1; then
      echo "sanitize $kind $t: ok"
    else
      echo "sanitize $kind $t: FAILED (log: $dir/$t.log)"; tail -30 "$dir/$t.log"; status=1
    fi
  done
done

# Thread-safety analysis: the core compiled by clang++ with -Wthread-safety as
# an error. Only Clang has the analysis (GCC sees no annotations), so clang is
# installed here the way scripts/setup.sh installs packages.
if ! command -v clang++ >/dev/null 2>&1; then
  echo "sanitize: installing Debian package: clang"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq clang >/dev/null
fi
dir=build-tsa
[ -f "$dir/build.ninja" ] || CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DPINS_WITH_TORCH=OFF \
  -DPINS_BUILD_TESTS=OFF -DPINS_BUILD_PROFILING=OFF -DPINS_WITH_CUDA=OFF -DPINS_NVTX=OFF \
  -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety" >/dev/null
# A file that fails stays unbuilt, so a rerun analyses it again.
if cmake --build "$dir" --target pins_core > "$dir/analysis.log" 2>&1; then
  echo "sanitize thread-safety pins_core: ok"
else
  echo "sanitize thread-safety pins_core: FAILED (log: $dir/analysis.log)"
  grep -E "error|warning" "$dir/analysis.log" | head -30; status=1
fi
exit $status
