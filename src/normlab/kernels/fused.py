"""Fused LayerNorm / RMSNorm / add+norm: the math written once, compiled by inductor.

Each function below is plain torch code on ``N, D`` rows; ``torch.compile``
turns it into one C++/OpenMP kernel per call on CPU (Triton on CUDA) that
reads its inputs once and writes its outputs once: the per-row statistics and
the normalized output are computed row by row in one parallel loop, never as
separate passes over memory.

The only cross-row reduction is the weight/bias gradient. A plain
``(dy * x_hat).sum(0)`` compiles to a loop that walks columns across all rows
(slow, and a second full pass); instead rows are summed in fixed blocks of
:data:`ROW_BLOCK`, then the block sums are added. The order is fixed by the
block size, not by the thread count, so weight gradients are bitwise
repeatable.
"""
from __future__ import annotations

import functools
import threading
import time
import types
import warnings

import torch

from .._checks import acc_dtype
from ..reference import rstd_of
from .base import Kernel, add_residual

#: rows per partial sum of dweight/dbias (fixed: it defines the summation order)
ROW_BLOCK = 32

#: first-call (compile) seconds per (function, dtype, device), for `normlab bench`
COLD_START_S: dict[str, float] = {}


def _acc(x: torch.Tensor) -> torch.dtype:
    return acc_dtype(x.dtype)


def _col_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``N, D`` over rows in fixed blocks of ROW_BLOCK rows, then over blocks."""
    n, d = t.shape
    pad = (-n) % ROW_BLOCK  # zero rows up to a whole block; inductor folds this into masked loads
    t = torch.nn.functional.pad(t, (0, 0, 0, pad))  # NB*ROW_BLOCK, D
    return t.reshape(-1, ROW_BLOCK, d).sum(1).sum(0)  # D


# ------------------------------------------------------------------ the math
#
# Written so that inductor emits ONE loop over rows per function: inside it, a
# row's reductions and its outputs, the row staying in L1 between them. Two
# rules make that happen (checked in the generated code, docs/performance.md):
# only raw row sums leave a kernel (a pointwise function of a reduction, such
# as ``rstd``, returned as an output gets a loop of its own over all rows), and
# the statistics the backward needs are formed from those sums by the caller.


def ln_fwd(x, w, b, eps: float):
    """Returns ``(y, sum_x, sum_sq_dev)``: the row sum and sum of squared deviations."""
    xf = x.to(_acc(x))  # N, D
    d = xf.shape[-1]
    s1 = xf.sum(-1, keepdim=True)  # N, 1   first pass
    xc = xf - s1 / d  # N, D
    m2 = (xc * xc).sum(-1, keepdim=True)  # N, 1   second pass, over the row in cache
    y = xc * rstd_of(m2 / d, eps)  # N, D
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y.to(x.dtype), s1, m2


def rms_fwd(x, w, eps: float):
    """Returns ``(y, sum_sq)``."""
    xf = x.to(_acc(x))  # N, D
    ss = (xf * xf).sum(-1, keepdim=True)  # N, 1
    y = xf * rstd_of(ss / xf.shape[-1], eps)  # N, D
    if w is not None:
        y = y * w
    return y.to(x.dtype), ss


def add_ln_fwd(x, r, w, b, eps: float, s_dtype: torch.dtype):
    s = add_residual(x, r, s_dtype)  # N, D   rounded to s_dtype before it is normalized
    y, s1, m2 = ln_fwd(s, w, b, eps)
    return y.to(x.dtype), s, s1, m2


def add_rms_fwd(x, r, w, eps: float, s_dtype: torch.dtype):
    s = add_residual(x, r, s_dtype)  # N, D
    y, ss = rms_fwd(s, w, eps)
    return y.to(x.dtype), s, ss


def ln_bwd(dy, x, mean, rstd, w, ds):
    """``(dx [+ ds], dw, db)``; see docs/layernorm.md eq. (4)."""
    ad = _acc(x)
    dyf = dy.to(ad)  # N, D
    xhat = (x.to(ad) - mean) * rstd  # N, D
    g = dyf * w if w is not None else dyf  # N, D
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))  # N, D
    if ds is not None:
        dx = dx + ds
    dw = _col_sum(dyf * xhat) if w is not None else None  # D
    return dx.to(x.dtype), dw, _col_sum(dyf)


def rms_bwd(dy, x, rstd, w, ds):
    """``(dx [+ ds], dw)``; docs/layernorm.md eq. (7)."""
    ad = _acc(x)
    dyf = dy.to(ad)  # N, D
    xhat = x.to(ad) * rstd  # N, D
    g = dyf * w if w is not None else dyf  # N, D
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))  # N, D
    if ds is not None:
        dx = dx + ds
    dw = _col_sum(dyf * xhat) if w is not None else None  # D
    return dx.to(x.dtype), dw


def _ln_stats(s1, m2, d: int, eps: float):
    """(mean, rstd) from the forward's row sums: N values, computed eagerly."""
    return s1 / d, rstd_of(m2 / d, eps)


# ------------------------------------------------------------------ compilation
#
# dynamo keeps its compiled variants per code object, up to a recompile limit. Rather than
# raising that limit for the whole process, each variant of a function (dtype, device, which
# optional tensors are present, eps) gets its own code object, compiled once: the state is
# this module's table of compiled functions, and nothing of torch's configuration changes.

_lock = threading.Lock()
_compiled: dict[tuple, object] = {}


def _variant(fn, key: tuple):
    """``fn`` with a fresh code object of its own (named after ``key``): its own dynamo cache."""
    tag = "_".join(str(k).removeprefix("torch.") for k in key)
    code = fn.__code__.replace(co_name=f"{fn.__name__}__{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _compiled_fn(fn, key: tuple):
    with _lock:
        c = _compiled.get(key)
        if c is None:
            # emulate_precision_casts: a half-precision s = x + r is rounded before it is normalized,
            # as in eager; otherwise fusion decisions (which vary with the shape) decide the bits.
            c = _compiled[key] = torch.compile(
                _variant(fn, key), dynamic=True, fullgraph=True, options={"emulate_precision_casts": True}
            )
        return c


def _run(fn, *args):
    """Run the compiled ``fn``; the first call per variant compiles (timed per function/dtype/device)."""
    if torch.compiler.is_compiling():  # inside a user's torch.compile: let it trace the math
        return fn(*args)
    x = args[0]
    key = (fn.__name__, x.dtype, x.device.type,
           *(type(a).__name__ if isinstance(a, (torch.Tensor, type(None))) else a for a in args[1:]))
    c = _compiled_fn(fn, key)
    label = f"{fn.__name__}/{str(x.dtype).removeprefix('torch.')}/{x.device.type}"
    if label in COLD_START_S:
        return c(*args)
    t0 = time.perf_counter()
    out = c(*args)
    COLD_START_S[label] = time.perf_counter() - t0
    return out


@functools.cache
def _probe() -> str | None:
    """None if inductor compiles here (a C++ compiler on CPU, Triton on CUDA), else the reason."""
    try:
        torch.compile(lambda t: (t * 2).sum(-1), dynamic=False, fullgraph=True)(torch.ones(2, 3))
        return None
    except Exception as e:  # noqa: BLE001 - any compiler failure means "not available"
        reason = f"{type(e).__name__}: {e}"
        warnings.warn(f"normlab: torch.compile is unavailable ({reason[:200]}); "
                      "the fused kernels fall back to other paths", RuntimeWarning, stacklevel=3)
        return reason


def available() -> bool:
    """Whether inductor can compile here; probed once, in a clean context.

    Never probed while a tracer or exporter runs (it would fail there for reasons
    that say nothing about the machine): then the answer is False for that call only.
    """
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():
        return False
    return _probe() is None


class CompiledKernel(Kernel):
    """The fused math above, compiled; every op, every floating dtype."""

    name = "compiled"

    def supports(self, op: str, x: torch.Tensor, eps: float) -> bool:
        return available()

    def ln_fwd(self, x, w, b, eps):
        y, s1, m2 = _run(ln_fwd, x, w, b, eps)
        return (y, *_ln_stats(s1, m2, x.shape[-1], eps))

    def ln_bwd(self, dy, x, mean, rstd, w):
        return _run(ln_bwd, dy, x, mean, rstd, w, None)

    def rms_fwd(self, x, w, eps):
        y, ss = _run(rms_fwd, x, w, eps)
        return y, rstd_of(ss / x.shape[-1], eps)

    def rms_bwd(self, dy, x, rstd, w):
        return _run(rms_bwd, dy, x, rstd, w, None)

    def add_ln_fwd(self, x, r, w, b, eps, s_dtype):
        y, s, s1, m2 = _run(add_ln_fwd, x, r, w, b, eps, s_dtype)
        return (y, s, *_ln_stats(s1, m2, x.shape[-1], eps))

    def add_rms_fwd(self, x, r, w, eps, s_dtype):
        y, s, ss = _run(add_rms_fwd, x, r, w, eps, s_dtype)
        return y, s, rstd_of(ss / x.shape[-1], eps)

    def add_ln_bwd(self, dy, s, mean, rstd, w, ds):
        return _run(ln_bwd, dy, s, mean, rstd, w, ds)

    def add_rms_bwd(self, dy, s, rstd, w, ds):
        return _run(rms_bwd, dy, s, rstd, w, ds)
