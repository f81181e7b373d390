"""The C++ kernels' build cannot strand a user: each failure falls back with one warning and right numbers.

Every case runs in a fresh process with its own empty kernel cache
(``NORMLAB_CACHE_DIR``), so the build really happens there. Builds use
``-O0`` (a later flag wins over the build's ``-O3``): these tests are about
how the build fails, and ``-O0`` builds several times faster. The compiled
path is switched off in the child (``use_compiled(False)``) so a fallback
lands on torch's kernel or the reference without an inductor compile.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest

import normlab
from normlab.kernels import build

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")

CHILD = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    from normlab import functional as F, kernels
    from normlab.kernels import cpu
    g = torch.Generator().manual_seed(0)
    impls, errs = {}, {}
    with kernels.use_compiled(False):
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(70, 24, generator=g).to(dtype).requires_grad_()
            r = torch.randn(70, 24, generator=g).to(dtype)
            w = (1 + torch.randn(24, generator=g)).to(dtype).requires_grad_()
            for op in kernels.OPS:
                def run(impl):
                    fn = getattr(F, op)
                    y = fn(x, r, 24, w, impl=impl)[0] if op.startswith("add_") else fn(x, 24, w, impl=impl)
                    return (y, *torch.autograd.grad(y.float().square().sum(), (x, w)))
                key = f"{op}/{str(dtype).removeprefix('torch.')}"
                impls[key] = kernels.resolve("auto", op, x, 1e-5)
                errs[key] = max(((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1)).item()
                                for a, b in zip(run("auto"), run("reference")))  # relative to the largest value
        run("auto")  # more calls: still no further warning
msgs = [str(c.message) for c in caught if str(c.message).startswith("normlab")]
print(json.dumps({"impls": impls, "errs": errs, "warnings": msgs, "dtypes": sorted(map(str, cpu.dtypes()))}))
"""


def _env(tmp_path: pathlib.Path, **extra: str) -> dict:
    src = str(pathlib.Path(normlab.__file__).resolve().parents[1])
    env = dict(os.environ, NORMLAB_CACHE_DIR=str(tmp_path / "cache"), NORMLAB_CXXFLAGS="-O0",
               PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    env.pop("CXX", None)
    env.pop("NORMLAB_DISPATCH_FILE", None)  # the child's decisions in its own cache, as a fresh machine's
    env.update(extra)
    return env


def _child(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def _check_numbers(res: dict) -> None:
    tol = {"float32": 1e-5, "float16": 2e-2}
    for key, err in res["errs"].items():
        assert err <= tol[key.split("/")[1]], (key, err)


def _script(tmp_path: pathlib.Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("case", ["false", "hangs", "bad-timeout", "unquoted-cxx", "unquoted-flags"])
def test_broken_compiler_falls_back_with_one_warning(case, tmp_path):
    if case == "false":
        env = _env(tmp_path, CXX="/bin/false")
        reason = "exited with 1"
    elif case.startswith("unquoted"):  # shlex's ValueError stopped every norm call
        name = "CXX" if case == "unquoted-cxx" else "NORMLAB_CXXFLAGS"
        env = _env(tmp_path, **{name: 'g++ "-O2' if name == "CXX" else '-O2 "'})
        reason = f"{name}="
    elif case == "bad-timeout":  # it raised ValueError from every call
        env = _env(tmp_path, NORMLAB_BUILD_TIMEOUT="2m")
        reason = "NORMLAB_BUILD_TIMEOUT='2m' is not a number of seconds > 0"
    else:  # a compiler that never answers is killed after NORMLAB_BUILD_TIMEOUT seconds
        env = _env(tmp_path, CXX=_script(tmp_path, "slow-cxx", "sleep 60"), NORMLAB_BUILD_TIMEOUT="1")
        reason = "timed out after 1 s"
    res = _result(_child(env))
    assert "cpu" not in res["impls"].values() and res["dtypes"] == []
    assert len(res["warnings"]) == 1 and reason in res["warnings"][0], res["warnings"]
    _check_numbers(res)


@needs_gxx
@pytest.mark.parametrize("how", ["under-a-file", "mode-0555"])
def test_unwritable_cache_builds_in_a_temporary_directory(how, tmp_path):
    cache = tmp_path / "cache"
    if how == "under-a-file":  # the cache path goes through a regular file: nothing can be created there
        cache.write_text("not a directory")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a mode-0555 directory")
        (cache / "kernels").mkdir(parents=True)
        (cache / "kernels").chmod(0o555)
    res = _result(_child(_env(tmp_path)))
    assert res["impls"]["rms_norm/float32"] == "cpu" and res["impls"]["layer_norm/float16"] == "cpu"
    assert len(res["warnings"]) == 1 and "not writable" in res["warnings"][0], res["warnings"]
    _check_numbers(res)


@needs_gxx
@pytest.mark.parametrize("flag", ["-DNORMLAB_NO_FLOAT16", "-U__FLT16_MAX__"])
def test_build_without_float16_keeps_the_other_dtypes(flag, tmp_path):
    """``-U__FLT16_MAX__`` is what a compiler without ``_Float16`` (GCC 11) looks like to the source."""
    res = _result(_child(_env(tmp_path, NORMLAB_CXXFLAGS=f"-O0 {flag}")))
    assert res["dtypes"] == ["torch.bfloat16", "torch.float32", "torch.float64"]
    assert all(impl == "cpu" for key, impl in res["impls"].items() if key.endswith("float32") and "rms" in key)
    assert all(impl != "cpu" for key, impl in res["impls"].items() if key.endswith("float16"))
    assert len(res["warnings"]) == 1 and "_Float16" in res["warnings"][0], res["warnings"]
    _check_numbers(res)


@needs_gxx
def test_concurrent_first_use_builds_once(tmp_path):
    """Two processes meet an empty cache at once: one builds (its translation units, then one link), the other
    waits for it; neither warns."""
    log = tmp_path / "compiles.log"
    cxx = _script(tmp_path, "logging-cxx", f'case "$*" in *--version*) ;; *" -c "*) echo unit >> "{log}";; '
                                           f'*) echo link >> "{log}";; esac\nexec g++ "$@"')
    env = _env(tmp_path, CXX=cxx)
    children = [_child(env), _child(env)]
    results = [_result(p) for p in children]
    assert sorted(log.read_text().splitlines()) == ["link"] + ["unit"] * len(build.UNITS)
    assert len(list((tmp_path / "cache" / "kernels").glob("normlab_cpu_*.so"))) == 1
    for res in results:
        assert res["warnings"] == [] and res["impls"]["rms_norm/float16"] == "cpu"
        _check_numbers(res)


@needs_gxx
def test_one_failing_translation_unit_fails_the_build_once_and_leaves_nothing_behind(tmp_path):
    """The units compile in parallel: the bfloat16 unit's failure is the one warning, the other units' objects
    and the half-built library are removed, and nothing but the lock is left in the cache."""
    cxx = _script(tmp_path, "cxx-without-bf16", 'case "$*" in *NORMLAB_UNIT=3*) echo "no bf16 here" >&2; exit 3;; '
                                                'esac\nexec g++ "$@"')
    res = _result(_child(_env(tmp_path, CXX=cxx)))
    assert res["dtypes"] == [] and "cpu" not in res["impls"].values()
    assert len(res["warnings"]) == 1 and "exited with 3: no bf16 here" in res["warnings"][0], res["warnings"]
    left = sorted(p.name for p in (tmp_path / "cache" / "kernels").iterdir())
    assert len(left) == 1 and left[0].endswith(".so.lock"), left
    _check_numbers(res)


WIDTH_CHILD = r"""
import json, torch
from normlab.kernels import cpu
torch.set_num_threads(2)
k, g, out = cpu.CpuKernel(), torch.Generator().manual_seed(0), []
for dt in sorted(cpu.dtypes(), key=str):
    for n, d, rms, add in ((5, 77, False, True), (9, 768, True, False), (3, 4100, False, False), (4, 1, True, True),
                           (1000, 96, False, True)):  # threaded: 125-row chunks, or 16 with CHUNK_BYTES=0
        x = torch.randn(n, d, generator=g).to(dt)
        r = torch.randn(n, d, generator=g).to(dt) if add else None
        w, b = torch.randn(d, generator=g), None if rms else torch.randn(d, generator=g)
        y, s, m, rs = k.fwd(x, r, w, b, 1e-5, rms=rms)
        dx, dw, db = k.bwd(torch.randn(n, d, generator=g).to(dt), x if s is None else s, m, rs, w, None, rms=rms)
        out.append([t.contiguous().view(-1).view(torch.uint8).tolist() for t in (y, s, m, rs, dx, dw, db)
                    if t is not None])
print(json.dumps(out))
"""


@needs_gxx
def test_the_bits_do_not_depend_on_the_vector_width(tmp_path):
    """The kernels built for this CPU (64-byte vectors on AVX-512, 32 on AVX) and built with 16-byte vectors and
    16-row chunks (the rule before) give the same bits, forward and backward, streamed or not, every dtype the
    build has."""
    outs = []
    narrow = "-DNORMLAB_VECTOR_BYTES=16 -DNORMLAB_CHUNK_BYTES=0"
    for width, stream in (("", {}), (narrow, {}), ("", {"NORMLAB_STREAM_BYTES": "0"})):
        # one cache per width: the streamed run loads the native build made by the first
        env = _env(tmp_path / f"w{width}", NORMLAB_CXXFLAGS=f"-O1 {width}")
        env.pop("NORMLAB_STREAM_BYTES", None)
        env.update(stream)
        run = subprocess.run([sys.executable, "-c", WIDTH_CHILD], env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        outs.append(json.loads(run.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]  # native width and chunks against 16 bytes and 16 rows
    assert outs[0] == outs[2]  # streamed stores: the same bits


def test_a_hanging_compiler_does_not_hang_the_compiled_kernels(tmp_path):
    """normlab's build gave up after NORMLAB_BUILD_TIMEOUT, but the inductor probe behind rms_norm's fallback
    asked the same compiler without a limit and hung the call."""
    env = _env(tmp_path, CXX=_script(tmp_path, "slow-cxx", "exec sleep 60"), NORMLAB_BUILD_TIMEOUT="1")
    child = ("import warnings, torch\nwith warnings.catch_warnings(record=True) as ws:\n"
             "    warnings.simplefilter('always')\n    from normlab import functional as F\n"
             "    y = F.rms_norm(torch.randn(4, 64), 64)\n"
             "print(all(torch.isfinite(y).flatten().tolist()), [str(w.message) for w in ws])")
    run = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=40)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("True") and "torch.compile is unavailable (the C++ compiler" in run.stdout


def test_a_cxx_that_cannot_be_split_is_a_problem_named_not_a_crash(monkeypatch):
    """The checks before torch.compile and the dispatch cache's build key split $CXX too: shlex's ValueError
    escaped both."""
    from normlab.kernels import autotune

    monkeypatch.setenv("CXX", 'g++ "-O2')
    assert build.compiler_problem().startswith("CXX='g++ \"-O2' cannot be split into words")
    assert autotune._build_key.__wrapped__() == "none"
