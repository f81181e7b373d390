"""normlab's own CPU kernels: ``cpu_kernels.cpp``, compiled at first use, called through ctypes.

The C++ source needs no torch headers, so it builds in about a second with the
system's ``g++`` (or ``$CXX``) and is cached under the user cache directory
(``$NORMLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/normlab``, else ``~/.cache/normlab``),
keyed on a hash of the source, the compiler and the CPU model. Where no
compiler works, :meth:`CpuKernel.supports` is False and ``auto`` falls back to
the compiled path.

What the kernels do (rows of float32, float64, bfloat16 or float16; statistics,
weights and weight gradients in the accumulation dtype: float64 for float64,
float32 otherwise; outputs rounded once to the input's dtype):

* forward, one parallel loop over rows: ``s = x + r`` (add variants),
  ``mean = sum(s) / D``, ``var = sum((s - mean)^2) / D`` (two passes over a row
  held in L1), ``rstd = 1 / sqrt(var + eps)``,
  ``y = (s - mean) * rstd * w + b``;
* backward, single pass over memory: each fixed block of 32 rows computes
  ``dx = rstd * (g - mean(g) - x_hat * mean(g x_hat))`` (``g = dy * w``; RMSNorm
  drops ``mean(g)``) and accumulates its partial ``dw = sum dy x_hat`` and
  ``db = sum dy``; a second loop adds the partial rows in block order.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import warnings

import torch

from .._checks import acc_dtype
from .base import Kernel

SOURCE = pathlib.Path(__file__).with_name("cpu_kernels.cpp")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++17")
_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16"}


def cache_dir() -> pathlib.Path:
    """Where the built library is kept (created on demand)."""
    root = os.environ.get("NORMLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "normlab"
    )
    return pathlib.Path(root) / "kernels"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln for ln in f if ln.startswith(("model name", "flags"))), platform.machine())
    except OSError:
        return platform.machine()


def _build(cxx: str) -> pathlib.Path:
    src = SOURCE.read_bytes()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(src + version.encode() + " ".join(FLAGS).encode() + _cpu_model().encode()).hexdigest()[:16]
    out = cache_dir() / f"normlab_cpu_{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, check=True)
        os.replace(tmp, out)  # atomic: concurrent builders each write their own file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where no C++ compiler works (warned once).

    A fact about the machine, computed once; never changed by what a caller is
    doing (tracing, exporting, compiling).
    """
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None or platform.system() != "Linux":
        return None
    try:
        lib = ctypes.CDLL(str(_build(cxx)))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        warnings.warn(f"normlab: CPU kernels unavailable ({detail.strip()[:200]}); using the compiled path",
                      RuntimeWarning, stacklevel=2)
        return None
    p, i64, dbl, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
    for suf in _DTYPES.values():
        getattr(lib, f"normlab_fwd_{suf}").argtypes = [p] * 8 + [i64, i64, dbl, i32, i32]
        getattr(lib, f"normlab_bwd_{suf}").argtypes = [p] * 10 + [i64, i64, i32, i32]
    lib.normlab_rows_per_partial.restype = i64
    return lib


def available() -> bool:
    return library() is not None


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _param(p: torch.Tensor | None, dtype: torch.dtype):
    return None if p is None else p.detach().to(dtype).contiguous()


def _fwd(x, r, w, b, eps, rms):
    n, d = x.shape
    dt, ad = x.dtype, acc_dtype(x.dtype)
    y = torch.empty_like(x)
    s = torch.empty_like(x) if r is not None else None
    mean = None if rms else x.new_empty(n, 1, dtype=ad)
    rstd = x.new_empty(n, 1, dtype=ad)
    w, b = _param(w, ad), _param(b, ad)
    fn = getattr(library(), f"normlab_fwd_{_DTYPES[dt]}")
    fn(_ptr(x), _ptr(r), _ptr(s), _ptr(w), _ptr(b), _ptr(y), _ptr(mean), _ptr(rstd), n, d, eps, int(rms),
       torch.get_num_threads())
    return y, s, mean, rstd


def _bwd(dy, x, mean, rstd, w, ds, rms):
    n, d = x.shape
    dt, ad = x.dtype, acc_dtype(x.dtype)
    dy = dy.to(dt)  # N, D   (a float32 s under a half-precision y: residual_in_fp32)
    ds = None if ds is None else ds.to(dt)
    dx = torch.empty_like(x)
    rows = library().normlab_rows_per_partial()
    partial = x.new_empty((n + rows - 1) // rows, 2, d, dtype=ad)
    dw = x.new_empty(d, dtype=ad) if w is not None else None
    db = None if rms else x.new_empty(d, dtype=ad)
    if n == 0:
        return dx, None if dw is None else dw.zero_(), None if db is None else db.zero_()
    fn = getattr(library(), f"normlab_bwd_{_DTYPES[dt]}")
    w = _param(w, ad)  # held in a name: a temporary would be freed before the call reads it
    fn(_ptr(dy), _ptr(x), _ptr(mean), _ptr(rstd), _ptr(w), _ptr(ds), _ptr(dx), _ptr(dw), _ptr(db),
       _ptr(partial), n, d, int(rms), torch.get_num_threads())
    return dx, dw, db


class CpuKernel(Kernel):
    """normlab's C++ kernels: every op, every floating dtype, on CPU."""

    name = "cpu"

    def supports(self, op: str, x: torch.Tensor, eps: float) -> bool:
        return x.device.type == "cpu" and x.dtype in _DTYPES and available()

    def ln_fwd(self, x, w, b, eps):
        y, _, mean, rstd = _fwd(x, None, w, b, eps, False)
        return y, mean, rstd

    def ln_bwd(self, dy, x, mean, rstd, w):
        return _bwd(dy, x, mean, rstd, w, None, False)

    def rms_fwd(self, x, w, eps):
        y, _, _, rstd = _fwd(x, None, w, None, eps, True)
        return y, rstd

    def rms_bwd(self, dy, x, rstd, w):
        dx, dw, _ = _bwd(dy, x, None, rstd, w, None, True)
        return dx, dw

    def add_ln_fwd(self, x, r, w, b, eps, s_dtype):
        if s_dtype != x.dtype or r.dtype != x.dtype:
            return super().add_ln_fwd(x, r, w, b, eps, s_dtype)
        y, s, mean, rstd = _fwd(x, r, w, b, eps, False)
        return y, s, mean, rstd

    def add_rms_fwd(self, x, r, w, eps, s_dtype):
        if s_dtype != x.dtype or r.dtype != x.dtype:
            return super().add_rms_fwd(x, r, w, eps, s_dtype)
        y, s, _, rstd = _fwd(x, r, w, None, eps, True)
        return y, s, rstd

    def add_ln_bwd(self, dy, s, mean, rstd, w, ds):
        return _bwd(dy, s, mean, rstd, w, ds, False)

    def add_rms_bwd(self, dy, s, rstd, w, ds):
        dx, dw, _ = _bwd(dy, s, None, rstd, w, ds, True)
        return dx, dw
