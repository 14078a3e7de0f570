#!/usr/bin/env bash
# One call on a lent GPU machine: build pins against that machine's torch, run
# every test (the CUDA ones included) and the benchmarks, and write the logs
# under $OUT. That machine has no GoogleTest or nlohmann-json package: run
# profiling/gpu_prepare.sh here first, which copies their sources into
# .gpu-deps/ (ignored by git), with a diffusers wheel in .gpu-deps/wheels for
# what compares with its offload modes, and carry it along:
#   device run: carry [".gpu-deps"], command "bash profiling/gpu_check.sh"
# Without .gpu-deps (and without the packages) the script stops at once,
# saying so, before any device time goes into a build that cannot succeed.
# The device returns at most 8 files from $OUT: this script writes 6
# (summary.txt, nvidia-smi.txt, build.log, ctest.log, pytest.log, bench.txt)
# and a scratch file (bench.part);
# the summary has the machine (nproc, /proc/meminfo), each step's outcome and
# every benchmark's RESULT line.
# A device call may run 600 s and a session has 900 s of device time in all, so
# every step runs under `timeout` within a budget (GPU_CHECK_BUDGET_S, default
# 540 s) and the summary is written whatever is cut: the build and the tests
# that need a device first, the benchmarks after, the longest last.
# GPU_CHECK_DRY_RUN=1 runs it all without a CUDA device (a CPU machine, another
# torch release): what a device would run, short of what needs one; on a few
# cores give the build longer than its 300 s (GPU_CHECK_BUILD_S).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
deadline=$((SECONDS + ${GPU_CHECK_BUDGET_S:-540}))
# step SECONDS CMD...: runs CMD with at most SECONDS, less what the budget has left.
step() {
  local want=$1 left=$((deadline - SECONDS))
  shift
  if [ "$left" -le 5 ]; then
    echo "(skipped: the budget is spent)"
    return 124
  fi
  [ "$want" -lt "$left" ] || want=$left
  timeout "$want" "$@"
}
# bench NAME SECONDS CMD...: a benchmark into bench.txt, its last line into the summary.
bench() {
  local name=$1 want=$2
  shift 2
  echo "== $name: $*" >> "$OUT/bench.txt"
  step "$want" "$@" > "$OUT/bench.part" 2>&1
  local rc=$?
  cat "$OUT/bench.part" >> "$OUT/bench.txt"
  log "bench $name (rc=$rc): $(tail -1 "$OUT/bench.part")"
  rm -f "$OUT/bench.part"
}

log "machine: $(nproc) CPUs; $(grep -E '^(MemTotal|MemAvailable|SwapTotal):' /proc/meminfo | tr -s ' ' | paste -sd ';')"
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if [ "${GPU_CHECK_DRY_RUN:-0}" != 1 ]; then
    log "no CUDA device visible to torch: GPU check skipped (GPU_CHECK_DRY_RUN=1 runs it anyway)"
    exit 0
  fi
  log "dry run: no CUDA device; the CUDA tests skip, the device benchmarks fail"
fi
{ nvidia-smi || echo "(no nvidia-smi)"; } > "$OUT/nvidia-smi.txt" 2>&1
log "torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no device")' 2>&1)"
gtest_arg=()
if [ -d .gpu-deps/googletest ]; then
  gtest_arg=(-DPINS_GTEST_SOURCE="$PWD/.gpu-deps/googletest")
elif [ ! -d /usr/src/googletest ] && [ ! -f /usr/include/gtest/gtest.h ]; then
  log "no .gpu-deps/googletest and no GoogleTest package: run profiling/gpu_prepare.sh on the build machine and carry .gpu-deps"
  exit 1
fi
if [ -d .gpu-deps/nlohmann ]; then
  gtest_arg+=(-DPINS_NLOHMANN_INCLUDE="$PWD/.gpu-deps/nlohmann")
elif [ ! -f /usr/include/nlohmann/json.hpp ]; then
  log "no .gpu-deps/nlohmann and no nlohmann-json package: run profiling/gpu_prepare.sh on the build machine and carry .gpu-deps"
  exit 1
fi
# diffusers from .gpu-deps/wheels, for the tests and benchmarks that use it
# (its own needs are in the GPU image); without it they skip or say "n/a".
site=/tmp/pins-gpu-site
if ls .gpu-deps/wheels/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
     --no-cache-dir --upgrade --target "$site" .gpu-deps/wheels/*.whl > /dev/null 2>&1; then
  log "diffusers: $(PYTHONPATH="$site" python3 -c 'import diffusers; print(diffusers.__version__)' 2>&1 | tail -1)"
else
  log "no .gpu-deps/wheels (profiling/gpu_prepare.sh): the diffusers tests skip, its offload modes read n/a"
fi
mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh python3)
cmake -S . -B build-gpu -G Ninja "${torch_args[@]}" "${gtest_arg[@]}" > "$OUT/build.log" 2>&1 \
  || { log "configure failed (build.log)"; tail -30 "$OUT/build.log"; exit 1; }
step "${GPU_CHECK_BUILD_S:-300}" cmake --build build-gpu -j "$(nproc)" >> "$OUT/build.log" 2>&1 \
  || { log "build failed (build.log)"; tail -40 "$OUT/build.log"; exit 1; }
log "built"
# The C++ suites (the model-based test shortened: the CPU runs the long one).
(cd build-gpu && PINS_MODEL_OPS=20000 step 120 ctest --output-on-failure -j "$(nproc)") > "$OUT/ctest.log" 2>&1
log "ctest rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
# The Python tests a device changes: the CUDA ones, the cast paths, the
# extension, gathered pins, files, streamed modules and their prefetch (the
# CPU-only rest runs in CI).
PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" PYTHONPATH="$PWD/python_bindings:$site" \
  step 180 python3 -m pytest -q tests/python/test_cuda.py tests/python/test_cast_to_device.py \
  tests/python/test_fast_path.py tests/python/test_gathered.py tests/python/test_load_file.py \
  tests/python/test_contract.py tests/python/test_prefetch.py tests/python/test_nn.py > "$OUT/pytest.log" 2>&1
log "pytest rc=$? $(tail -1 "$OUT/pytest.log")"
: > "$OUT/bench.txt"
bench alloc 60 build-gpu/bin/pins-bench alloc
# The hot paths on a GPU: host-to-device from a pin against a pageable tensor's .to()
# and against a torch pinned tensor's non_blocking copy (a raw pinned
# cudaMemcpyAsync underneath), then the lowvram loop casting to the device.
bench h2d 60 env PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" python3 profiling/bench_h2d.py
# A miss to the device: the pin's fill and its transfer in overlapping chunks
# (Note [Chunked fill]) against a pageable .to(device, dtype).
bench miss 60 env PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" python3 profiling/bench_miss.py --device cuda
# Note [Shared pins]: host-to-device from a segment another process filled (this
# process's own registration of the shared pages) against a private pin.
bench "share h2d" 60 env PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" python3 profiling/bench_share_h2d.py
bench fill 60 build-gpu/bin/pins-bench fill
bench cast 60 build-gpu/bin/pins-bench cast
bench "cast (python)" 60 env PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" python3 profiling/bench_cast_python.py
# A lowvram forward of a layer stack, weights on the CPU: per-layer .to(), pins
# without and with prefetch (Note [Copies that overlap compute]), diffusers'
# group offload with its stream, in one run.
bench prefetch 120 env PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" PYTHONPATH="$site" \
  python3 profiling/bench_prefetch.py --device cuda
# Host RAM of a diffusers pipeline: pins against diffusers' offload modes.
bench "diffusers ram" 120 env PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" PYTHONPATH="$site" \
  python3 profiling/bench_diffusers_ram.py --device cuda
bench "lowvram cuda:0 (100 x 32 MiB, 4 passes)" 240 \
  build-gpu/bin/pins-bench lowvram --device cuda:0 --layers 100 --layer-mib 32 --passes 4
log "time used: ${SECONDS} s"
cat "$OUT/summary.txt"
