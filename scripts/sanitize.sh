#!/usr/bin/env bash
# The torch-free core's tests under AddressSanitizer+UBSan and ThreadSanitizer,
# in build-asan/ and build-tsan/ (no torch needed).
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
exit $status
