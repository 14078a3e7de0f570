#!/usr/bin/env bash
# The torch-free core's tests under AddressSanitizer+UBSan and ThreadSanitizer,
# in build-asan/ and build-tsan/, the torch ops' C++ tests under ASan+UBSan in
# build-asan-ops/, then Clang's thread-safety analysis of the
# core's lock annotations (csrc/base/thread_safety.h, Note [Lock order]) in
# build-tsa/ (no torch needed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
status=0
# --build-only configures and builds every tree and runs nothing: CI starts it in
# the background while pytest runs (scripts/test.sh, PINS_PREBUILD_SANITIZERS)
# and lets it run on through make test-platforms, so these builds use the core
# pytest and the installs leave idle, and make sanitize then only runs the tests.
build_only=0
[ "${1:-}" = "--build-only" ] && build_only=1
# Each step's wall time, as scripts/test.sh prints it.
step_start=$SECONDS
took() { echo "time $1: $((SECONDS - step_start)) s"; step_start=$SECONDS; }
# A prebuild still running holds build/.sanitize-prebuild.lock (scripts/test.sh):
# wait for it, so that two builds never share a tree.
if [ $build_only = 0 ] && [ -f build/.sanitize-prebuild.lock ]; then
  exec 9<build/.sanitize-prebuild.lock
  flock 9
  exec 9<&-
  took "waiting for the sanitizer prebuild"
  if grep -q "FAILED\|error:" build/test-results/sanitize-prebuild.log 2>/dev/null; then
    echo "the sanitizer prebuild failed (log: build/test-results/sanitize-prebuild.log); building again"
  fi
fi
# -g1, as scripts/build.sh and scripts/fuzz.sh: the sanitizers' reports keep
# function, file and line, and a translation unit compiles about a third faster
# than with Debug's -g (23.7 -> 15.8 s for tests/ops/ops_test.cpp under ASan,
# 11.7 -> 7.6 s for the balancer's tests under TSan, on the 2-core CPU VM).
debug_info="-DCMAKE_CXX_FLAGS_DEBUG=-g1"
for kind in asan tsan; do
  case $kind in
    asan) flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" ;;
    tsan) flags="-fsanitize=thread" ;;
  esac
  dir=build-$kind
  [ -f "$dir/build.ninja" ] || cmake -S . -B "$dir" -G Ninja -DPINS_WITH_TORCH=OFF -DCMAKE_BUILD_TYPE=Debug \
    "$debug_info" -DCMAKE_CXX_FLAGS="$flags -O1" >/dev/null
  cmake --build "$dir" --target pins_core_tests pins_backend_tests pins_sysmem_tests pins_sim_tests pins_share_tests
  [ $build_only = 1 ] && continue
  for t in pins_core_tests pins_backend_tests pins_sysmem_tests pins_sim_tests pins_share_tests; do
    # The chaos test's workers run instrumented too: a quarter of its kills.
    if PINS_CHAOS_KILLS=50 "$dir/bin/$t" --gtest_brief=1 > "$dir/$t.log" 2>&1; then
      echo "sanitize $kind $t: ok"
    else
      echo "sanitize $kind $t: FAILED (log: $dir/$t.log)"; tail -30 "$dir/$t.log"; status=1
    fi
  done
  took "sanitize $kind"
done

# The torch ops (libpins.so) and their C++ tests (pins_torch_tests, pins_ops_tests,
# pins_model_tests) under ASan+UBSan, in build-asan-ops/ against the venv's
# torch (scripts/torch_cmake_args.sh, as scripts/build.sh). libtorch itself is
# not instrumented; leak checking stays on, and torch 2.13 (CPU) needs no
# suppression. The model-based test runs a tenth of its sequence here
# (PINS_MODEL_OPS=10000, about 50 s): ASan and -O1 slow it about tenfold.
if [ -x .venv/bin/python ]; then
  dir=build-asan-ops
  flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  if [ ! -f "$dir/build.ninja" ]; then
    mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh .venv/bin/python)
    cmake -S . -B "$dir" -G Ninja "${torch_args[@]}" -DCMAKE_BUILD_TYPE=Debug "$debug_info" -DPINS_BUILD_PROFILING=OFF \
      -DPINS_WITH_CUDA=OFF -DPINS_NVTX=OFF -DPINS_COPY_TO_PACKAGE=OFF \
      -DCMAKE_CXX_FLAGS="$flags -O1" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  fi
  cmake --build "$dir" --target pins_torch_tests pins_ops_tests pins_model_tests
  [ $build_only = 1 ] && exit 0  # the thread-safety analysis is itself a build: make sanitize runs it
  for t in pins_torch_tests pins_ops_tests pins_model_tests; do
    if ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" PINS_MODEL_OPS=${PINS_MODEL_OPS:-10000} \
       "$dir/bin/$t" --gtest_brief=1 > "$dir/$t.log" 2>&1; then
      echo "sanitize asan $t: ok"
    else
      echo "sanitize asan $t: FAILED (log: $dir/$t.log)"; tail -40 "$dir/$t.log"; status=1
    fi
  done
  took "sanitize asan torch ops"
else
  echo "sanitize asan torch ops: FAILED (no .venv with torch: run scripts/setup.sh)"; status=1
fi

# Thread-safety analysis: the core compiled by clang++ with -Wthread-safety as
# an error. Only Clang has the analysis (GCC sees no annotations), so clang is
# installed here the way scripts/setup.sh installs packages.
if ! command -v clang++ >/dev/null 2>&1; then
  echo "sanitize: installing Debian package: clang"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq clang >/dev/null
fi
# The analysis is Clang's Sema, done before any code is generated: each file is
# compiled with -fsyntax-only and otherwise the same flags (so the same analysis;
# an unguarded read still fails the file), its object an empty stamp touched when
# it passes. On the 2-core VM: 18 s and 33 CPU-s, against 29 s and 55 CPU-s
# generating -O2 -g code nobody links.
dir=build-tsa
[ -f "$dir/build.ninja" ] || CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DPINS_WITH_TORCH=OFF \
  -DPINS_BUILD_TESTS=OFF -DPINS_BUILD_PROFILING=OFF -DPINS_WITH_CUDA=OFF -DPINS_NVTX=OFF \
  -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety" \
  "-DCMAKE_CXX_COMPILE_OBJECT=<CMAKE_CXX_COMPILER> <DEFINES> <INCLUDES> <FLAGS> -fsyntax-only -c <SOURCE> && touch <OBJECT>" \
  >/dev/null
# A file that fails stays unbuilt, so a rerun analyses it again.
if cmake --build "$dir" --target pins_core > "$dir/analysis.log" 2>&1; then
  echo "sanitize thread-safety pins_core: ok"
else
  echo "sanitize thread-safety pins_core: FAILED (log: $dir/analysis.log)"
  grep -E "error|warning" "$dir/analysis.log" | head -30; status=1
fi
took "thread-safety"
exit $status
