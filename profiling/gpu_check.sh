#!/usr/bin/env bash
# One call on a lent GPU machine: build pins against that machine's torch, run
# every test (the CUDA ones included) and the benchmarks, and write the logs
# under $OUT. GoogleTest is not installed there: prepare a copy of its source
# here first (profiling/gpu_prepare.sh puts it in .gpu-deps/, carried along).
#   device run: carry [".gpu-deps"], command "bash profiling/gpu_check.sh"
# A device call may run 600 s and a session has 900 s of device time in all, so
# every step runs under `timeout` within a budget (GPU_CHECK_BUDGET_S, default
# 540 s) and the summary is written whatever is cut: the build and the tests
# that need a device first, the benchmarks after, the longest last.
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

# No GPU (or a torch without CUDA): nothing here measures anything; say so and succeed.
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  log "no CUDA device visible to torch: GPU check skipped"
  exit 0
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' | tee -a "$OUT/summary.txt"
gtest_arg=()
[ -d .gpu-deps/googletest ] && gtest_arg=(-DPINS_GTEST_SOURCE="$PWD/.gpu-deps/googletest")
[ -d .gpu-deps/nlohmann ] && gtest_arg+=(-DPINS_NLOHMANN_INCLUDE="$PWD/.gpu-deps/nlohmann")
mapfile -t torch_args < <(bash scripts/torch_cmake_args.sh python3)
cmake -S . -B build-gpu -G Ninja "${torch_args[@]}" "${gtest_arg[@]}" > "$OUT/configure.log" 2>&1 \
  || { log "configure failed"; tail -30 "$OUT/configure.log"; exit 1; }
step 300 cmake --build build-gpu -j 16 > "$OUT/build.log" 2>&1 || { log "build failed"; tail -40 "$OUT/build.log"; exit 1; }
log "built"
# The C++ suites (the model-based test shortened: the CPU runs the long one).
(cd build-gpu && PINS_MODEL_OPS=20000 step 120 ctest --output-on-failure -j 16) > "$OUT/ctest.log" 2>&1
log "ctest rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
# The Python tests a device changes: the CUDA ones, the cast paths, the
# extension, gathered pins, files (the CPU-only rest runs in CI).
PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" PYTHONPATH="$PWD/python_bindings" \
  step 150 python3 -m pytest -q tests/python/test_cuda.py tests/python/test_cast_to_device.py \
  tests/python/test_fast_path.py tests/python/test_gathered.py tests/python/test_load_file.py \
  tests/python/test_contract.py > "$OUT/pytest.log" 2>&1
log "pytest rc=$? $(tail -1 "$OUT/pytest.log")"
step 60 build-gpu/bin/pins-bench alloc > "$OUT/bench-alloc.txt" 2>&1
log "bench alloc: $(tail -1 "$OUT/bench-alloc.txt")"
# The hot paths on a GPU: host-to-device from a pin against a pageable tensor's .to()
# and against a torch pinned tensor's non_blocking copy (a raw pinned
# cudaMemcpyAsync underneath), then the lowvram loop casting to the device.
PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" step 60 python3 profiling/bench_h2d.py > "$OUT/bench-h2d.txt" 2>&1
log "bench h2d: $(tail -1 "$OUT/bench-h2d.txt")"
# A miss to the device: the pin's fill and its transfer in overlapping chunks
# (Note [Chunked fill]) against a pageable .to(device, dtype).
PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" step 60 python3 profiling/bench_miss.py --device cuda \
  > "$OUT/bench-miss.txt" 2>&1
log "bench miss: $(tail -1 "$OUT/bench-miss.txt")"
step 60 build-gpu/bin/pins-bench fill > "$OUT/bench-fill.txt" 2>&1
log "bench fill: $(tail -1 "$OUT/bench-fill.txt")"
step 60 build-gpu/bin/pins-bench cast > "$OUT/bench-cast.txt" 2>&1
log "bench cast: $(tail -1 "$OUT/bench-cast.txt")"
PINS_LIBRARY="$PWD/build-gpu/lib/libpins.so" step 60 python3 profiling/bench_cast_python.py \
  > "$OUT/bench-cast-python.txt" 2>&1
log "bench cast (python): $(tail -1 "$OUT/bench-cast-python.txt")"
step 240 build-gpu/bin/pins-bench lowvram --device cuda:0 --layers 100 --layer-mib 32 --passes 4 \
  > "$OUT/bench-lowvram-cuda.txt" 2>&1
log "bench lowvram cuda:0 (100 x 32 MiB, 4 passes): $(tail -1 "$OUT/bench-lowvram-cuda.txt")"
log "time used: ${SECONDS} s"
cat "$OUT/summary.txt"
