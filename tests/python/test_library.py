import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = os.path.join(ROOT, "build", "lib", "libpins.so")


def test_library_loads_with_torch_ops_load_library():
    # A fresh process, so nothing else has loaded it first.
    code = "import torch; torch.ops.load_library(%r); print(sorted(torch.ops.loaded_libraries))" % LIB
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "libpins.so" in out.stdout
