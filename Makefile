# Two entry points, each doing all set-up on a fresh machine:
#   make demo   the main job
#   make test   every test of this platform, ending with one summary line
# and, for what runs elsewhere:
#   make test-platforms   the second torch release, the hip backend and the Windows build
.PHONY: setup build demo test test-platforms sanitize clean

setup:
	@bash scripts/setup.sh

build: setup
	@bash scripts/build.sh

# The demo: a scaled WAN 2.2 workflow replayed through pins on real safetensors files
# (written to build/demo/models on the first run), per policy, against pins-sim's
# prediction. It builds only what it runs: libpins.so and torch_pins._C, copied
# into the package (pins_python_lib), and pins-sim.
demo: setup
	@bash scripts/build.sh pins_python_lib pins-sim
	@.venv/bin/python profiling/demo/demo.py

test: build
	@bash scripts/test.sh

# The builds for other platforms and torch releases: the torch layer for torch
# 2.14.1, the hip backend against ROCm 5.2 and the core for Windows under wine.
test-platforms: build
	@bash scripts/test_platforms.sh

# The core's tests under ASan+UBSan and TSan, the torch ops' C++ tests under ASan+UBSan,
# and Clang's thread-safety analysis.
sanitize: setup
	@bash scripts/sanitize.sh

clean:
	rm -rf build build-asan build-tsan build-tsa build-asan-ops build-fuzz build-hip build-win build-torch-*
