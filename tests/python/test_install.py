"""An install from a fresh clone into another prefix and another venv (make
test-platforms runs it; make test checks the release wheel of its own build in
short form, test_wheel_install.py): the
source package (sdist) built from the clone, unpacked into a clean folder and
built there by `pip wheel --no-build-isolation` against the venv's torch; the
wheel runs the README's Python examples in a venv of its own (its casts through
the wheel's torch_pins._C); the release wheel packed from that build
(scripts/release.py, the short form: one build) installs into a fresh venv with
no compiler on PATH; `cmake --install` gives a package that the C++ app finds
from another prefix with only torch's prefix added; and none carries a path of
the build machine.

The clone is the work tree as git sees it (tracked and new, not ignored, files),
so uncommitted changes are tested too; in CI, a fresh clone, that is the clone.
Everything lives under $PINS_INSTALL_CHECK_DIR (default build/install-check,
removed by `make clean`) and is reused, so a rerun is incremental:
  src/          the clone (files copied only when changed, so ninja rebuilds nothing else)
  sdist/        the source package built from src/ (pyproject's build_sdist)
  sdist-src/    that package unpacked (files written only when their content changed)
  venv-torch-X.Y/  the other venv: torch (local wheel only), scikit-build-core
  wheel-build/  scikit-build-core's build-dir: also the tree `cmake --install` installs from
  dist/         the wheel
  release/      the release wheel and the fresh venv it is installed into
  prefix/       the CMake package, installed into stage/ and then moved here (relocatable)
  app-build/    examples/cpp_app built against prefix/
On a fresh machine the wheel's native build takes about 3-4 minutes (2 cores),
the venv about 30 s, the app about 1 minute; a rerun about 1.5 minutes. The
release wheel's check (pack, auditwheel, a fresh venv, pip install, a cast and
stats) took 113 s on the 2-core VM under a load average of 20 (other builds
beside it), each Python start there about 30 s of it.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import release  # noqa: E402  (scripts/release.py: the release wheel's packing and checks)

sys.path.pop(0)
TESTS = os.path.dirname(os.path.abspath(__file__))  # torchscript_caster.py, scripted in the venv
WORK = os.path.abspath(os.environ.get("PINS_INSTALL_CHECK_DIR", os.path.join(ROOT, "build", "install-check")))
SRC = os.path.join(WORK, "src")
SDIST_SRC = os.path.join(WORK, "sdist-src")
# One venv per torch release: the wheel is built for, and installed into, the torch running the tests.
RELEASE = ".".join(torch.__version__.split("+", 1)[0].split(".")[:2])  # MAJOR.MINOR of the torch running the tests
VARIANT = "cu" + torch.version.cuda.split(".")[0] if torch.version.cuda else "cpu"  # the build the wheel carries
VENV = os.path.join(WORK, "venv-torch-" + RELEASE)
VENV_PY = os.path.join(VENV, "bin", "python")
TIMES = []  # (step, seconds), printed in failure messages and by -s


def run(step, cmd, **kw):
    """Runs `cmd` (a list), records its time under `step`; fails with its output."""
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=kw.pop("env", clean_env()), **kw)
    TIMES.append((step, time.monotonic() - start))
    assert out.returncode == 0, f"{step}: {' '.join(cmd)} exited {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


def clean_env(**extra):
    """This environment without what points into the repository's own build."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PINS_LIBRARY", "PINS_CONF", "PINS_SIM", "PINS_BENCH", "VIRTUAL_ENV",
                        "CMAKE_ARGS", "CMAKE_PREFIX_PATH", "pins_DIR")}
    env.update(extra)
    return env


def sync_clone():
    """SRC becomes the work tree as a clone would have it: git's tracked and new
    (not ignored) files, build trees left out; files that did not change keep
    their times."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    wanted = set()
    for rel in listed:
        if not rel or rel.split("/", 1)[0].startswith("build"):
            continue  # build/ and the per-engineer build-*/ trees are never part of a clone
        src = os.path.join(ROOT, rel)
        if not os.path.lexists(src):
            continue  # deleted in the work tree
        wanted.add(rel)
        dst = os.path.join(SRC, rel)
        if os.path.islink(src):
            if not os.path.islink(dst) or os.readlink(dst) != os.readlink(src):
                if os.path.lexists(dst):
                    os.remove(dst)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.symlink(os.readlink(src), dst)
            continue
        st = os.stat(src)
        if os.path.isfile(dst) and not os.path.islink(dst):
            dt = os.stat(dst)
            if dt.st_size == st.st_size and int(dt.st_mtime) == int(st.st_mtime):
                continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.lexists(dst):
            os.remove(dst)
        shutil.copy2(src, dst)
    for dirpath, dirnames, filenames in os.walk(SRC, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.relpath(path, SRC) not in wanted:
                os.remove(path)
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                if os.path.relpath(path, SRC) not in wanted:
                    os.remove(path)
            elif not os.listdir(path):
                os.rmdir(path)


def venv_site():
    """The venv's site-packages."""
    lib = os.path.join(VENV, "lib")
    found = [d for d in os.listdir(lib) if d.startswith("python")]
    assert len(found) == 1, found
    return os.path.join(lib, found[0], "site-packages")


def torch_release_of_this_python():
    return torch.__version__.split("+", 1)[0]


def venv_release_lib():
    """Where the venv's wheel keeps the build for this torch's release."""
    return os.path.join(venv_site(), "torch_pins", "_lib", f"torch-{RELEASE}-{VARIANT}")


def make_venv():
    """The other venv, once: torch from a local wheel only (--no-index: never a
    download), then what the build needs (scikit-build-core) and torch's own
    dependencies from the index."""
    if os.path.exists(VENV_PY):
        return
    pip = [VENV_PY, "-m", "pip", "install", "-q", "--no-compile"]
    version = torch_release_of_this_python()
    probe = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                            "--no-index", "--no-deps", f"torch=={version}"], capture_output=True, text=True,
                           env=clean_env())
    if probe.returncode != 0:
        pytest.skip(f"no local wheel of torch=={version} here, and the install test never downloads one")
    run("venv: create", [sys.executable, "-m", "venv", VENV])
    run("venv: torch (local wheel)", pip + ["--no-index", "--no-deps", f"torch=={version}"])
    run("venv: torch's dependencies, scikit-build-core", pip + [f"torch=={torch_release_of_this_python()}",
                                                              "scikit-build-core>=1.1"])


def unpack_sdist(sdist):
    """SDIST_SRC becomes the contents of `sdist`, writing only the files whose
    content changed (the package's times are all one fixed date, so ninja would
    see no change; a file written now does)."""
    wanted = set()
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            rel = member.name.split("/", 1)[1]
            wanted.add(rel)
            data = tar.extractfile(member).read()
            dst = os.path.join(SDIST_SRC, rel)
            if os.path.isfile(dst) and open(dst, "rb").read() == data:
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(data)
            os.chmod(dst, member.mode & 0o777)
    for dirpath, _, filenames in os.walk(SDIST_SRC):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.relpath(path, SDIST_SRC) not in wanted:
                os.remove(path)


@pytest.fixture(scope="module")
def installed():
    """Clone, venv, source package (built from the clone, unpacked), wheel (built
    from it and installed in the venv), CMake package (installed into stage/,
    moved to prefix/). Returns the paths."""
    start = time.monotonic()
    os.makedirs(WORK, exist_ok=True)
    sync_clone()
    TIMES.append(("clone (git ls-files copy)", time.monotonic() - start))
    make_venv()

    sdist_dir = os.path.join(WORK, "sdist")
    shutil.rmtree(sdist_dir, ignore_errors=True)
    os.makedirs(sdist_dir)
    # The backend of pyproject.toml, as pip or `python -m build --sdist` calls it: no torch needed.
    sdist = release.make_sdist(SRC, sdist_dir, VENV_PY)
    unpack_sdist(sdist)
    dist = os.path.join(WORK, "dist")
    shutil.rmtree(dist, ignore_errors=True)
    run("wheel: pip wheel --no-build-isolation of the unpacked sdist (native build)",
        [VENV_PY, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", dist,
         "-C", f"build-dir={os.path.join(WORK, 'wheel-build')}", SDIST_SRC])
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    wheel = os.path.join(dist, wheels[0])
    subprocess.run([VENV_PY, "-m", "pip", "uninstall", "-q", "-y", "torch-pins"], capture_output=True, env=clean_env())
    # --no-index: the wheel's torch requirement must be met by the torch already there.
    run("wheel: pip install --no-index", [VENV_PY, "-m", "pip", "install", "-q", "--no-index", wheel])

    stage, prefix = os.path.join(WORK, "stage"), os.path.join(WORK, "prefix")
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(prefix, ignore_errors=True)
    run("cmake --install (component cpp)", ["cmake", "--install", os.path.join(WORK, "wheel-build"),
                                             "--prefix", stage, "--component", "cpp"])
    os.rename(stage, prefix)  # installed for one prefix, used from another
    yield {"wheel": wheel, "prefix": prefix, "sdist": sdist}
    print("\ninstall check times:\n" + "\n".join(f"  {s:<60} {t:7.1f} s" for s, t in TIMES))


def needles():
    """Paths of the build machine that nothing installed may name."""
    import torch

    found = {ROOT, WORK, os.path.realpath(ROOT), sys.prefix, VENV, os.path.dirname(torch.__file__)}
    return sorted(n for n in found if n and n != "/")


def leaks(name, data):
    text = data.decode("latin-1")
    return [f"{name} names {n}" for n in needles() if n in text]


def times():
    return "\n".join(f"{s}: {t:.1f} s" for s, t in TIMES)


def test_wheel_requires_the_torch_release_it_is_built_against(monkeypatch, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "torch_release", os.path.join(ROOT, "python_bindings", "backend", "torch_release.py"))
    provider = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(provider)
    assert provider.torch_requirement("2.13.0+cpu") == "torch==2.13.*"
    assert provider.torch_requirement("2.14.1") == "torch==2.14.*"
    with pytest.raises(ValueError, match="version must start with MAJOR.MINOR, got 'nightly'"):
        provider.torch_requirement("nightly")
    with pytest.raises(ValueError, match=r"takes no settings, got \['x'\]"):
        provider.dynamic_metadata({"x": 1}, {})
    assert provider.dynamic_metadata({}, {}) == {
        "dependencies": [provider.torch_requirement(torch_release_of_this_python())]}
    # A wheel carrying several releases requires any of them and none between them that it lacks.
    assert provider.requirement_for(["2.13.0+cpu"]) == "torch==2.13.*"
    assert provider.requirement_for(["2.13.0+cpu", "2.14", "2.11.0+cu130"]) == "torch>=2.11,<2.15,!=2.12.*"
    assert provider.requirement_for(["2.13.0", "2.14.1", "2.13.1"]) == "torch>=2.13,<2.15"
    with pytest.raises(ValueError, match="share a major version"):
        provider.requirement_for(["1.13", "2.1"])
    with pytest.raises(ValueError, match="at least one torch version"):
        provider.requirement_for([])
    # The source package builds against any release from the oldest tested.
    monkeypatch.setenv("PINS_BUILD_HOOK", "sdist")
    assert provider.dynamic_metadata({}, {}) == {"dependencies": ["torch>=2.11"]}
    monkeypatch.delenv("PINS_BUILD_HOOK")
    # The release wheel requires the releases of the builds it packs, whatever their variants.
    for name, lib in [("torch-2.11-cu13", True), ("torch-2.13-cpu", True), ("torch-2.13-cu13", True),
                      ("torch-2.15-cu13", True), ("torch-2.14-cu13", False), ("torch-2.12", True)]:
        (tmp_path / name).mkdir()
        if lib:
            (tmp_path / name / "libpins.so").write_bytes(b"")
    assert provider.packaged_releases(str(tmp_path)) == ["2.11", "2.13", "2.15"]
    monkeypatch.setattr(provider, "PACKAGE_LIB", str(tmp_path))
    monkeypatch.setenv("PINS_WHEEL_PREBUILT", "1")
    assert provider.dynamic_metadata({}, {}) == {"dependencies": ["torch>=2.11,<2.16,!=2.12.*,!=2.14.*"]}
    monkeypatch.setattr(provider, "PACKAGE_LIB", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="which holds none"):
        provider.dynamic_metadata({}, {})


def test_wheel_is_platform_tagged_stripped_and_pins_its_torch(installed):
    name = os.path.basename(installed["wheel"])
    assert re.fullmatch(r"torch_pins-[0-9.]+-cp3\d+-cp3\d+-linux_x86_64\.whl", name), name
    z = zipfile.ZipFile(installed["wheel"])
    names = z.namelist()
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    lib = f"torch_pins/_lib/torch-{RELEASE}-{VARIANT}"
    extension = lib + "/_C" + sysconfig.get_config_var("EXT_SUFFIX")  # the venv's Python is this one
    for want in ["torch_pins/__init__.py", "torch_pins/__main__.py", "torch_pins/_fake.py", "torch_pins/_version.py",
                 "torch_pins/py.typed", "torch_pins/comfy/__init__.py", "torch_pins/comfy/hooks.py",
                 lib + "/libpins.so", lib + "/libpins.so.torch", extension,
                 f"{info}/licenses/LICENSE", f"{info}/entry_points.txt"]:
        assert want in names, (want, names)
    # The demo and its replay tooling are the source tree's (profiling/demo), not the runtime package's.
    assert not [n for n in names if n.startswith("torch_pins/") and ("demo" in n or "replay" in n)], names
    meta = z.read(f"{info}/METADATA").decode()
    assert f"Requires-Dist: torch=={RELEASE}.*" in meta, meta
    assert "License-Expression: BSD-3-Clause" in meta, meta
    from torch_pins._version import __version__

    assert f"\nVersion: {__version__}\n" in meta, meta
    assert z.read(f"{info}/licenses/LICENSE") == open(os.path.join(ROOT, "LICENSE"), "rb").read()
    for name in (lib + "/libpins.so", extension):
        lib = os.path.join(os.path.dirname(installed["wheel"]), os.path.basename(name))
        with open(lib, "wb") as f:
            f.write(z.read(name))
        sections = subprocess.run(["readelf", "-S", "-W", lib], capture_output=True, text=True, check=True).stdout
        assert ".symtab" not in sections and ".debug_info" not in sections, f"{name} in the wheel is not stripped"


def test_wheel_names_no_path_of_the_build_machine(installed):
    z = zipfile.ZipFile(installed["wheel"])
    found = [leak for n in z.namelist() for leak in leaks(n, z.read(n))]
    assert not found, found


def test_wheel_in_another_venv_runs_the_readme_python_examples(installed, tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "README.md has no python block"
    for i, code in enumerate(blocks):
        script = tmp_path / f"example{i}.py"
        script.write_text(code)
        run(f"README python block {i} in the venv", [VENV_PY, str(script)], cwd=str(tmp_path))


def test_wheel_in_another_venv_casts_through_its_extension(installed, tmp_path):
    # Note [Python fast path]: the wheel's torch_pins._C, beside the wheel's libpins.so, serves the cast.
    script = tmp_path / "fast_path.py"
    script.write_text("""
import warnings
import torch
warnings.simplefilter("error", RuntimeWarning)  # torch_pins's own, were the module not to load
import torch_pins as p
m = p.register_model("m", "cpu")
w = torch.randn(64)
for _ in range(2):
    assert torch.equal(p.cast_to_device(w, "cpu", model=m), w)
print(p._C.__file__, p.library_path(), p._C.path_counts(), p.stats()["hits"])
""")
    out = run("fast path in the venv", [VENV_PY, str(script)], cwd=str(tmp_path))
    lib = venv_release_lib()
    extension = os.path.join(lib, "_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    assert out.stdout.split() == [extension, os.path.join(lib, "libpins.so"), "{'fast':", "2,", "'forwarded':", "0}",
                                  "1"], out.stdout


def test_wheel_cli_in_another_venv(installed, tmp_path):
    from torch_pins._version import __version__

    stats = run("python -m torch_pins stats --json", [VENV_PY, "-m", "torch_pins", "stats", "--json"], cwd=str(tmp_path))
    s = json.loads(stats.stdout)
    # The venv's own package and library, not the repository's.
    assert s["library"] == os.path.join(venv_release_lib(), "libpins.so"), s
    assert s["version"] == __version__ and s["backend"] and s["counters"]["pins"] == 0, s
    script = os.path.join(VENV, "bin", "torch-pins")  # the same main as python -m torch_pins
    assert os.access(script, os.X_OK) and "torch_pins.__main__" in open(script).read()
    # The wheel ships no simulator and no demo: the CLI says where it looked and what to do.
    env = clean_env(PATH=os.path.join(VENV, "bin") + os.pathsep + "/usr/bin:/bin")
    for cmd, says in [("simulate", "pins-sim not found"), ("demo", "The demo is part of the source tree")]:
        out = subprocess.run([VENV_PY, "-m", "torch_pins", cmd], capture_output=True, text=True, env=env,
                             cwd=str(tmp_path))
        assert out.returncode == 2, (cmd, out.stdout, out.stderr)
        assert says in out.stderr and "make " in out.stderr, (cmd, out.stderr)


def test_installed_cmake_package_of_the_cpp_app_names_no_path_of_the_build_machine(installed):
    prefix = installed["prefix"]
    for rel in ["lib/libpins.so", "include/pins/ops.h", "lib/cmake/pins/pinsConfig.cmake",
                "lib/cmake/pins/pinsConfigVersion.cmake", "lib/cmake/pins/pinsTargets.cmake",
                "share/doc/pins/LICENSE"]:
        assert os.path.isfile(os.path.join(prefix, rel)), rel
    assert not os.path.exists(os.path.join(prefix, "bin")), "no program is installed: tests and their helpers stay"
    # Every public header of the source tree is installed.
    for dirpath, _, filenames in os.walk(os.path.join(SRC, "include", "pins")):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), os.path.join(SRC, "include"))
            assert os.path.isfile(os.path.join(prefix, "include", rel)), rel
    found = []
    for dirpath, _, filenames in os.walk(prefix):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if path.endswith((".cmake", ".h")):
                found += leaks(os.path.relpath(path, prefix), open(path, "rb").read())
    assert not found, found


def test_cpp_app_builds_and_runs_against_the_installed_prefix(installed, tmp_path):
    app_build = os.path.join(WORK, "app-build")
    cache = os.path.join(app_build, "CMakeCache.txt")
    if os.path.exists(cache):
        os.remove(cache)  # configure afresh: find_package(pins) runs each time
    torch_prefix = os.path.join(venv_site(), "torch", "share", "cmake")  # torch.utils.cmake_prefix_path
    # Only the two prefixes: the installed package and torch's own.
    run("cpp_app: configure", ["cmake", "-S", os.path.join(SRC, "examples", "cpp_app"), "-B", app_build, "-G", "Ninja",
                               f"-DCMAKE_PREFIX_PATH={installed['prefix']};{torch_prefix}"])
    cached = [line for line in open(cache).read().splitlines() if line.startswith("pins_DIR:")]
    # Resolved on both sides: when the checkout is reached through a symlink, this
    # test's paths and the one CMake caches may name the same directory differently.
    found = [os.path.realpath(line.split("=", 1)[1]) for line in cached]
    assert found == [os.path.realpath(os.path.join(installed["prefix"], "lib", "cmake", "pins"))], cached
    run("cpp_app: build", ["cmake", "--build", app_build])
    app = os.path.join(app_build, "pins_cpp_app")
    help_out = run("pins_cpp_app --help", [app, "--help"])
    assert help_out.stdout.startswith("usage: pins_cpp_app")
    module = str(tmp_path / "caster.pt")
    script = tmp_path / "script_caster.py"
    script.write_text(f"""
import sys
import torch
import torch_pins  # loads the library, so the op resolves while scripting

sys.path.append({TESTS!r})  # after the venv's own packages: only torchscript_caster comes from there
from torchscript_caster import Caster

torch.jit.script(Caster()).save({module!r})
""")
    run("cpp_app: script the module in the venv", [VENV_PY, str(script)])
    out = run("cpp_app: run", [app, module])
    assert out.stdout.startswith("pins_cpp_app: ok hits=2 misses=2 pins=2"), out.stdout + "\n" + times()


def test_source_package_holds_what_the_build_reads_and_no_tests(installed):
    with tarfile.open(installed["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for need in ["pyproject.toml", "PKG-INFO", "CMakeLists.txt", "cmake/wheel_torch.cmake", "scripts/torch_cmake_args.sh",
                 "python_bindings/backend/pins_build.py", "python_bindings/torch_pins/_library.py"]:
        assert need in names, need
    assert not [n for n in names if n.startswith(("tests/", "profiling/", "docs/", "build", ".venv")) or "/_lib/" in n]
    from torch_pins._version import __version__

    assert os.path.basename(installed["sdist"]) == f"torch_pins-{__version__}.tar.gz"


def test_release_wheel_installs_into_a_fresh_venv_without_a_compiler(installed, tmp_path):
    # scripts/release.py in short form: this torch's build (the wheel-build tree
    # above) installed with cmake --install, packed into the release wheel, tagged
    # by auditwheel with torch's libraries excluded, and installed into a fresh
    # venv that sees the torch of VENV and has only its own scripts on PATH.
    where = os.path.join(WORK, "release")
    shutil.rmtree(where, ignore_errors=True)
    stage = os.path.join(where, "stage")
    for component in ("python", "python_extension"):
        run(f"release: cmake --install (component {component})",
            ["cmake", "--install", os.path.join(WORK, "wheel-build"), "--component", component, "--prefix", stage,
             "--strip"])
    start = time.monotonic()
    raw = release.make_wheel(SDIST_SRC, os.path.join(stage, "torch_pins", "_lib"), os.path.join(where, "raw"), VENV_PY)
    TIMES.append(("release: pack the wheel (PINS_WHEEL_PREBUILT=1)", time.monotonic() - start))
    if shutil.which("auditwheel", path=os.path.dirname(sys.executable)) is None:
        pytest.fail("auditwheel is not installed in this venv: make setup (python_bindings/requirements-dev.txt)")
    start = time.monotonic()
    audited = release.audit(raw, where, sys.executable, release.torch_sonames([VENV_PY]))
    TIMES.append(("release: auditwheel repair, show", time.monotonic() - start))
    name = os.path.basename(audited["wheel"])
    assert re.fullmatch(r"torch_pins-[0-9.]+-py3-none-manylinux_\d+_\d+_x86_64\.whl", name), name
    assert audited["tag"] in name, audited
    meta = zipfile.ZipFile(audited["wheel"]).read(f"torch_pins-{name.split('-')[1]}.dist-info/METADATA").decode()
    assert f"Requires-Dist: torch=={RELEASE}.*" in meta, meta
    start = time.monotonic()
    checked = release.install_check(audited["wheel"], f"{RELEASE}-{VARIANT}", VENV_PY, sys.executable, where)
    TIMES.append((f"release: fresh venv, pip install ({checked['install_seconds']} s), cast, stats",
                  time.monotonic() - start))
    assert checked["paths"] == {"fast": 2, "forwarded": 0} and checked["hits"] == 1, checked


def test_a_torch_the_package_has_no_build_for_is_told_the_command_that_builds_one(installed):
    # The wheel in the venv made to carry only an older build (its own library,
    # restamped as 2.(minor-1)): import names it, the newest, and the command
    # that builds for this torch: pip install of the source package, as the
    # fixture built it (pip wheel --no-build-isolation); scripts/release.py runs
    # that very command on the .tar.gz from a clean folder.
    from torch_pins._version import __version__

    major, minor = RELEASE.split(".")
    older = f"{major}.{int(minor) - 1}"
    lib = venv_release_lib()
    fake = os.path.join(os.path.dirname(lib), f"torch-{older}-{VARIANT}")
    stamp = open(os.path.join(lib, "libpins.so.torch")).read()
    shutil.rmtree(fake, ignore_errors=True)
    os.rename(lib, fake)
    try:
        with open(os.path.join(fake, "libpins.so.torch"), "w") as f:
            f.write(f"{older}.0+{VARIANT}\n")
        out = subprocess.run([VENV_PY, "-c", "import torch_pins"], capture_output=True, text=True, env=clean_env(),
                             cwd=WORK)
    finally:
        with open(os.path.join(fake, "libpins.so.torch"), "w") as f:
            f.write(stamp)
        os.rename(fake, lib)  # the venv as the fixture left it
    assert out.returncode != 0
    said = out.stderr.strip().splitlines()[-1]
    assert f"it carries builds for torch {older} ({VARIANT}); the newest is {older}" in said, said
    command = f"pip install --no-build-isolation --no-deps --force-reinstall torch_pins-{__version__}.tar.gz"
    assert command in said and os.path.basename(installed["sdist"]) == command.split()[-1], said
    assert "scripts/" not in said, said  # an installed package has no source tree to point into
