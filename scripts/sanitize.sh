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
# PINS_UNITY_BUILD (CMakeLists.txt: the core and the simulator as unity builds,
# the suites with one precompiled header) for the TSan tree: 223 -> 137 s. Not
# for the ASan+UBSan trees, which build file by file as before: with it, at
# -O1, the core's first unity batch alone compiled for 166 s and the tree took
# 421 s (1,212 CPU-s) on the 2-core VM, and no per-file build of it was timed
# on the same idle machine to show a gain.
debug_info="-DCMAKE_CXX_FLAGS_DEBUG=-g1"
asan_flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
core_tests=(pins_core_tests pins_backend_tests pins_sysmem_tests pins_sim_tests pins_share_tests)
for kind in asan tsan; do
  case $kind in
    asan) flags=$asan_flags; unity=OFF ;;
    tsan) flags="-fsanitize=thread"; unity=ON ;;
  esac
  dir=build-$kind
  [ -f "$dir/build.ninja" ] || cmake -S . -B "$dir" -G Ninja -DPINS_WITH_TORCH=OFF -DCMAKE_BUILD_TYPE=Debug \
    "$debug_info" -DCMAKE_CXX_FLAGS="$flags -O1" -DPINS_UNITY_BUILD=$unity >/dev/null
  cmake --build "$dir" --target "${core_tests[@]}"
done

# The torch ops (libpins.so) and their C++ tests (pins_torch_tests, pins_ops_tests,
# pins_model_tests) under ASan+UBSan, in build-asan-ops/ against the venv's
# torch (scripts/torch_cmake_args.sh, as scripts/build.sh). libtorch itself is
# not instrumented; leak checking stays on, and torch 2.13 (CPU) needs no
# suppression. The model-based test runs a tenth of its sequence here
# (PINS_MODEL_OPS=10000, about 50 s): ASan and -O1 slow it about tenfold.
ops_tests=(pins_torch_tests pins_ops_tests pins_model_tests)
ops=(); [ -x .venv/bin/python ] && ops=(asan build-asan-ops)  # the torch ops' jobs: KIND DIR
if [ ${#ops[@]} -gt 0 ]; then
  dir=build-asan-ops
  flags=$asan_flags
  if [ ! -f "$dir/build.ninja" ]; then
    mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh .venv/bin/python)
    cmake -S . -B "$dir" -G Ninja "${torch_args[@]}" -DCMAKE_BUILD_TYPE=Debug "$debug_info" -DPINS_BUILD_PROFILING=OFF \
      -DPINS_WITH_CUDA=OFF -DPINS_NVTX=OFF -DPINS_COPY_TO_PACKAGE=OFF \
      -DCMAKE_CXX_FLAGS="$flags -O1" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  fi
  cmake --build "$dir" --target "${ops_tests[@]}"
fi
[ $build_only = 1 ] && exit 0  # the thread-safety analysis is itself a build: make sanitize runs it
took "sanitizer builds"

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
# The tests, each binary (the two largest core suites in two gtest shards) a
# job, run side by side on as many lanes as cores (PINS_SANITIZE_JOBS), longest
# first. On the 2-core VM they took 497 s one after another (the thread-safety
# analysis 45 of it) and 326 s on two lanes, where each ran slower beside
# another (the model-based test 69 -> 146 s). Each job's log is in its tree,
# its result printed in a fixed order once all are done.
lanes=${PINS_SANITIZE_JOBS:-$(nproc)}
shards=1; [ "$lanes" -gt 1 ] && shards=2
core_shards() { for i in $(seq 0 $((shards - 1))); do echo "$1 build-$1 pins_core_tests $i/$shards"; done; }
mapfile -t jobs_list < <(
  echo "tsan build-tsan pins_share_tests -"; core_shards tsan
  [ ${#ops[@]} -gt 0 ] && echo "${ops[*]} pins_model_tests -"
  echo "tsan build-tsan pins_sim_tests -"; echo "tsa build-tsa pins_core -"; core_shards asan
  for t in pins_sim_tests pins_share_tests pins_sysmem_tests pins_backend_tests; do echo "asan build-asan $t -"; done
  echo "tsan build-tsan pins_sysmem_tests -"; echo "tsan build-tsan pins_backend_tests -"
  [ ${#ops[@]} -gt 0 ] && echo "${ops[*]} pins_ops_tests -" && echo "${ops[*]} pins_torch_tests -"
  true)
# The job list names each suite again, in its order; a suite the trees build
# that it does not run is an error here, not a test that silently never runs.
expected=(); for t in "${core_tests[@]}"; do expected+=("asan build-asan $t" "tsan build-tsan $t"); done
[ ${#ops[@]} -gt 0 ] && for t in "${ops_tests[@]}"; do expected+=("${ops[*]} $t"); done
for e in "${expected[@]}"; do
  found=0; for job in "${jobs_list[@]}"; do [[ $job == "$e "* ]] && found=1; done
  [ $found = 1 ] || { echo "sanitize: the job list has no job \"$e\" (scripts/sanitize.sh)"; exit 1; }
done
job_name() { [ "$2" = - ] && echo "$1" || echo "$1.s${2%/*}"; }  # TEST SHARD: the job's log and result name
run_job() {  # KIND DIR TEST SHARD: writes DIR/NAME.log and .result ("ok|FAILED SECONDS")
  local kind=$1 dir=$2 t=$3 shard=$4 start=$SECONDS name env=()
  name=$(job_name "$t" "$shard")
  [ "$shard" != - ] && env+=(GTEST_SHARD_INDEX=${shard%/*} GTEST_TOTAL_SHARDS=${shard#*/})
  if [ "$dir" = build-asan-ops ]; then
    env+=(ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 PINS_MODEL_OPS=${PINS_MODEL_OPS:-10000})
  else
    env+=(PINS_CHAOS_KILLS=50)  # the chaos test's workers run instrumented too: a quarter of its kills
  fi
  local verdict=FAILED
  if [ "$kind" = tsa ]; then
    # A file that fails stays unbuilt, so a rerun analyses it again. One lane: one compile at a time.
    cmake --build "$dir" --target "$t" --parallel 1 > "$dir/$name.log" 2>&1 && verdict=ok
  else
    env "${env[@]}" "$dir/bin/$t" --gtest_brief=1 > "$dir/$name.log" 2>&1 && verdict=ok
  fi
  echo "$verdict $((SECONDS - start))" > "$dir/$name.result"
}
running=0
for job in "${jobs_list[@]}"; do
  read -r kind dir t shard <<<"$job"
  rm -f "$dir/$t".{log,result} "$dir/$t".s*.{log,result}
done
for job in "${jobs_list[@]}"; do
  if [ $running -ge "$lanes" ]; then wait -n; running=$((running - 1)); fi
  read -r kind dir t shard <<<"$job"
  run_job "$kind" "$dir" "$t" "$shard" &
  running=$((running + 1))
done
wait
for job in "${jobs_list[@]}"; do
  read -r kind dir t shard <<<"$job"
  name=$(job_name "$t" "$shard")
  label="$t"; [ "$shard" != - ] && label="$t (shard $shard)"
  read -r verdict secs < "$dir/$name.result" 2>/dev/null || { verdict=FAILED; secs=?; }
  [ "$kind" = tsa ] && kind=thread-safety
  if [ "$verdict" = ok ]; then
    echo "sanitize $kind $label: ok ($secs s)"
  elif [ "$kind" = thread-safety ]; then
    echo "sanitize $kind $label: FAILED (log: $dir/$name.log)"; grep -E "error|warning" "$dir/$name.log" | head -30; status=1
  else
    echo "sanitize $kind $label: FAILED (log: $dir/$name.log)"; tail -40 "$dir/$name.log"; status=1
  fi
done
[ ${#ops[@]} -gt 0 ] || { echo "sanitize asan torch ops: FAILED (no .venv with torch: run scripts/setup.sh)"; status=1; }
took "sanitizer tests"
exit $status
