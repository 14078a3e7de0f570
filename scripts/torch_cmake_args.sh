#!/usr/bin/env bash
# Prints the CMake arguments that find the torch of the Python given as $1, one
# per line: its cmake prefix, that Python itself (whose headers build
# torch_pins._C), the variant of that torch (cpu, or cuN for a torch built with
# CUDA N: the folder of the package the build goes to), and for a CUDA build of
# torch what its CUDA cmake config needs besides (no GPU probing: pins compiles
# no device code; the toolkit root, which a wrapper script for nvcc hides; nvrtc
# from torch's own wheels when the toolkit lacks it).
# With --package (a build that goes into the Python package: the wheel,
# scripts/build_release.sh) the CUDA backend follows torch, on for a CUDA torch
# and off for a CPU one, whose users have no libcudart.
set -euo pipefail
py=${1:?usage: torch_cmake_args.sh PYTHON [--package]}
package=${2:-}
PINS_PACKAGE_BUILD=$package "$py" - <<'PY'
import glob, os, sys
import torch, torch.utils
print("-DCMAKE_PREFIX_PATH=" + torch.utils.cmake_prefix_path)
print("-DPython_EXECUTABLE=" + sys.executable)
cuda = torch.version.cuda
print("-DPINS_TORCH_VARIANT=" + ("cu" + cuda.split(".")[0] if cuda else "cpu"))
if os.environ.get("PINS_PACKAGE_BUILD") == "--package":
    print("-DPINS_WITH_CUDA=" + ("ON" if cuda else "OFF"))
if cuda:
    print("-DTORCH_CUDA_ARCH_LIST=" + os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    if os.path.isdir("/usr/local/cuda"):
        print("-DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda")
    site = os.path.dirname(os.path.dirname(torch.__file__))
    nvrtc = sorted(glob.glob(site + "/nvidia/*/lib/libnvrtc.so*") + glob.glob(site + "/nvidia/cuda_nvrtc/lib/libnvrtc.so*"))
    if nvrtc and not glob.glob("/usr/local/cuda/lib*/libnvrtc.so*"):
        print("-DCUDA_nvrtc_LIBRARY=" + nvrtc[0])
PY
