# Two entry points, each doing all set-up on a fresh machine:
#   make demo   the main job
#   make test   every test, ending with one summary line
.PHONY: setup build demo test sanitize clean

setup:
	@bash scripts/setup.sh

build: setup
	@bash scripts/build.sh

demo: build
	@build/bin/pins-bench alloc
	@echo
	@build/bin/pins-sim --trace profiling/traces/wan22_a14b_32g_ram_32g_vram.json --runs 4

test: build
	@bash scripts/test.sh

# The core's tests under ASan+UBSan and TSan, the torch ops' C++ tests under ASan+UBSan,
# and Clang's thread-safety analysis.
sanitize: setup
	@bash scripts/sanitize.sh

clean:
	rm -rf build build-asan build-tsan build-tsa build-asan-ops build-fuzz
