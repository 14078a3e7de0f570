#!/usr/bin/env bash
# Sets up a ComfyUI checkout for tests/python/test_comfy.py (which is skipped
# unless COMFYUI_PATH names one). A developer's step, not CI's: CI has no
# checkout and runs the stand-in tests (test_comfy_standins.py) instead.
#
#   scripts/comfyui_checkout.sh SOURCE DEST [REV]
#
# SOURCE  ComfyUI's repository: a clone URL or a local repository (bare or not)
# DEST    where the checkout goes, outside this tree (it must not exist yet)
# REV     what to check out (default: SOURCE's HEAD)
#
# With COMFYUI_GGUF=REPO in the environment (a clone URL or a local repository
# of city96's ComfyUI-GGUF) it also clones that custom node into
# DEST/custom_nodes/ComfyUI-GGUF, where test_comfy.py's GGUF test finds it.
#
# Then it installs into the project's .venv ($PYTHON to choose another) the
# packages that importing comfy.sd, nodes and execution needs on the CPU. Never
# torch (the venv's is kept) nor ComfyUI's requirements.txt, which asks for
# torch, torchvision and torchaudio: PyPI's torchvision does not load beside
# the CPU torch of this project, so test_comfy.py stands in empty modules for
# torchvision and torchaudio when they are missing (no code path it runs uses
# them). A local repository that lacks some file contents (a partial mirror) is
# extracted file by file, and the files it lacks are listed and left out.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
source_repo=$1
dest=$2
rev=${3:-HEAD}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}

if [ -e "$dest" ]; then
    echo "comfyui_checkout: $dest exists already" >&2
    exit 1
fi
case "$(cd "$(dirname "$dest")" 2>/dev/null && pwd)/" in
    "$root"/*) echo "comfyui_checkout: $dest is inside the pins tree; put it elsewhere" >&2; exit 1 ;;
esac

if git clone --quiet --no-checkout "$source_repo" "$dest" 2>/dev/null &&
        git -C "$dest" checkout --quiet "$rev" -- . 2>/dev/null; then
    git -C "$dest" checkout --quiet "$rev"
else
    # A partial mirror: take every file whose contents the repository has.
    rm -rf "$dest"
    if [ -d "$source_repo/objects" ]; then git_dir=$source_repo; else git_dir=$source_repo/.git; fi
    mkdir -p "$dest"
    skipped=0
    while IFS=$'\t' read -r meta path; do
        read -r _mode type sha <<<"$meta"
        [ "$type" = blob ] || continue
        mkdir -p "$dest/$(dirname "$path")"
        if ! git --git-dir="$git_dir" cat-file blob "$sha" >"$dest/$path" 2>/dev/null; then
            rm -f "$dest/$path"
            echo "comfyui_checkout: $path is not in $source_repo, left out" >&2
            skipped=$((skipped + 1))
        fi
    done < <(git --git-dir="$git_dir" ls-tree -r "$rev")
    echo "comfyui_checkout: extracted $rev from $source_repo ($skipped files left out)"
fi

"$python" -m pip install --quiet psutil safetensors scipy einops tqdm pyyaml transformers tokenizers \
    sentencepiece av aiohttp yarl Pillow pydantic-settings trampoline gguf
# torchsde asks for torch (keep the venv's); comfy-kitchen is imported at module
# level by ComfyUI 0.33. comfy-aimdo is not installed: on this CPU machine the
# tests use tests/python/standins/comfy_aimdo (its README).
"$python" -m pip install --quiet --no-deps torchsde comfy-kitchen

if [ -n "${COMFYUI_GGUF:-}" ]; then
    git clone --quiet "$COMFYUI_GGUF" "$dest/custom_nodes/ComfyUI-GGUF"
    echo "ComfyUI-GGUF $(git -C "$dest/custom_nodes/ComfyUI-GGUF" rev-parse --short HEAD) in $dest/custom_nodes"
fi
echo "ComfyUI $(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$dest/comfyui_version.py" 2>/dev/null) in $dest"
echo "run: COMFYUI_PATH=$dest $python -m pytest tests/python/test_comfy.py tests/python/test_comfy_switches_comfyui.py"
