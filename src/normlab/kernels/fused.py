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
from ..reference import rstd_of, variance_of
from .base import Kernel, add_residual

#: rows per partial sum of dweight/dbias (fixed: it defines the summation order)
ROW_BLOCK = 32

#: first-call (compile) seconds per (function, dtype, device), for `normlab bench`
COLD_START_S: dict[str, float] = {}


def _acc(x: torch.Tensor) -> torch.dtype:
    return acc_dtype(x.dtype)


#: elements per chunk of a row sum on CPU (the C++ kernels' float32 chunk): inductor's CPU loops add each vector
#: lane along the whole row, and on rows with heavy tails that read 3-5x torch's error (docs/numerics.md)
SUM_CHUNK = 128


def _row_sum(t: torch.Tensor) -> torch.Tensor:
    """``N, D`` summed over rows' elements, ``N, 1``; on CPU a row longer than SUM_CHUNK in chunks of it (zeros
    past its end), the chunk sums then added the same way, level by level (on CUDA inductor's reductions are
    trees already). No sum is longer than SUM_CHUNK: with few rows inductor splits a long sum across threads,
    and a row alone would then be summed in another order than in a batch (docs/numerics.md)."""
    if t.device.type != "cpu":
        return t.sum(-1, keepdim=True)
    while t.shape[-1] > SUM_CHUNK:
        pad = (-t.shape[-1]) % SUM_CHUNK
        if pad:
            t = torch.nn.functional.pad(t, (0, pad))
        t = t.unflatten(-1, (-1, SUM_CHUNK)).sum(-1)  # N, ceil(D / SUM_CHUNK)
    return t.sum(-1, keepdim=True)  # N, 1


def _col_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``N, D`` over rows in fixed blocks of ROW_BLOCK rows, then over blocks."""
    n, d = t.shape
    pad = (-n) % ROW_BLOCK  # zero rows up to a whole block; inductor folds this into masked loads
    t = torch.nn.functional.pad(t, (0, 0, 0, pad))  # NB*ROW_BLOCK, D
    return t.reshape(t.shape[0] // ROW_BLOCK, ROW_BLOCK, d).sum(1).sum(0)  # D   (not -1: d may be 0)


# ------------------------------------------------------------------ the math
#
# Written so that inductor emits ONE loop over rows per function: inside it, a
# row's reductions and its outputs, the row staying in L1 between them. Two
# rules make that happen (checked in the generated code, docs/performance.md):
# only raw row sums leave a kernel (a pointwise function of a reduction, such
# as ``rstd``, returned as an output gets a loop of its own over all rows), and
# the statistics the backward needs are formed from those sums by the caller.


def fwd(x, r, w, b, eps: float, rms: bool, s_dtype: torch.dtype):
    """Returns ``(y, s, sum_s, sum_e, sum_e2)``: ``s = x + r`` (None without ``r``), the row sum of ``s``, of
    its deviations ``e`` from the first pass's mean (None for RMSNorm: :func:`stats`) and of their squares (of
    ``s``'s squares for RMSNorm)."""
    s = x if r is None else add_residual(x, r, s_dtype)  # N, D   rounded to s_dtype before it is normalized
    sf = s.to(_acc(s))  # N, D
    d = sf.shape[-1]
    if rms:
        s1 = e1 = None
        e2 = _row_sum(sf * sf)  # N, 1
        y = sf * stats(s1, e1, e2, d, eps)[1]  # N, D
    else:
        s1 = _row_sum(sf)  # N, 1   first pass
        e = sf - s1 / d  # N, D   deviations from the rounded mean (reference.layer_norm_forward)
        e1 = _row_sum(e)  # N, 1   second pass, over the row in cache
        e2 = _row_sum(e * e)  # N, 1
        y = (e - e1 / d) * stats(s1, e1, e2, d, eps)[1]  # N, D
    if w is not None:  # weights in the accumulation dtype (float64 ones of float32 input rounded to float32)
        y = y * w.type_as(y)
    if b is not None:
        y = y + b.type_as(y)
    return y.to(x.dtype), (None if r is None else s), s1, e1, e2


def stats(s1, e1, e2, d: int, eps: float):
    """``(mean, rstd)`` from :func:`fwd`'s row sums (mean None for RMSNorm)."""
    if s1 is None:
        return None, rstd_of(e2 / d, eps)
    c = e1 / d  # N, 1   the deviations' mean corrects the first pass's
    return s1 / d + c, rstd_of(variance_of(e2 / d, c), eps)


def bwd(dy, x, mean, rstd, w, ds, rms: bool):
    """``(dx [+ ds], dw, db)``; docs/layernorm.md eq. (4), and (7) for RMSNorm (no ``mean(g)``, no ``db``)."""
    ad = _acc(x)
    dyf = dy.to(ad)  # N, D
    xhat = x.to(ad) * rstd if rms else (x.to(ad) - mean) * rstd  # N, D
    g = dyf * w if w is not None else dyf  # N, D
    d = g.shape[-1]
    c2 = _row_sum(g * xhat) / d  # N, 1   (chunked sums, as the forward's: a plain mean is split across threads)
    if rms:
        dx = rstd * (g - xhat * c2)  # N, D
    else:
        dx = rstd * (g - _row_sum(g) / d - xhat * c2)  # N, D
    if ds is not None:
        dx = dx + ds
    dw = _col_sum(dyf * xhat) if w is not None else None  # D
    return dx.to(x.dtype), dw, (None if rms else _col_sum(dyf))


# ------------------------------------------------------------------ compilation
#
# dynamo keeps its compiled variants per code object, up to a recompile limit (8), and with
# fullgraph=True going past it is an error. Rather than raising that limit for the whole
# process, each variant of a function gets its own code object, compiled once: a variant is
# everything dynamo guards on (device, grad and inference mode, each tensor's dtype and
# requires_grad and which sizes are 0 or 1, which optional tensors are present, eps). The
# state is this module's table of compiled functions; nothing of torch's configuration changes.

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


def _guarded(a):
    """What dynamo specializes on in one argument: a tensor's dtype, whether it requires grad, and which of its
    sizes are 0 or 1 (``dynamic=True`` still specializes those); None; or the value itself (eps, flags)."""
    if isinstance(a, torch.Tensor):
        return (str(a.dtype).removeprefix("torch."), a.requires_grad, *(min(n, 2) for n in a.shape))
    return a


def _run(fn, label: str, *args):
    """Run the compiled ``fn``; the first call per variant compiles (timed per ``label``/dtype/device)."""
    if torch.compiler.is_compiling():  # inside a user's torch.compile: let it trace the math
        return fn(*args)
    x = args[0]
    key = (fn.__name__, x.device.type, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
           *(_guarded(a) for a in args))
    c = _compiled_fn(fn, key)
    label = f"{label}/{str(x.dtype).removeprefix('torch.')}/{x.device.type}"
    if label in COLD_START_S:
        return c(*args)
    t0 = time.perf_counter()
    out = c(*args)
    COLD_START_S[label] = time.perf_counter() - t0
    return out


def _label(rms: bool, add: bool, direction: str) -> str:
    return f"{'add_' if add else ''}{'rms' if rms else 'ln'}_{direction}"  # e.g. add_rms_fwd


@functools.cache
def _probe() -> str | None:
    """None if inductor compiles here (a C++ compiler on CPU, Triton on CUDA), else the reason. The compiler is
    asked first, within the build's time limit: inductor asks it without one, and one that hangs hung every
    call that tried the compiled kernels."""
    from . import build

    problem = build.compiler_problem()
    if problem is not None and problem != build.NO_COMPILER:  # (none at all: inductor says so itself, quickly)
        warnings.warn(f"normlab: torch.compile is unavailable (the C++ compiler: {problem[:200]}); the fused "
                      "kernels fall back to other paths", RuntimeWarning, stacklevel=3)
        return problem
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

    def accepts(self, op: str, x: torch.Tensor, eps: float) -> bool:
        return True

    def fwd(self, x, residual, w, b, eps, *, rms, s_dtype=None):
        one = x.shape[0] == 1  # a row alone runs as two rows (itself twice): the batch's compilation (_two_rows)
        x, residual = (_two_rows(x), _two_rows(residual)) if one else (x, residual)
        out = _run(fwd, _label(rms, residual is not None, "fwd"), x, residual, w, b, eps, rms, s_dtype or x.dtype)
        y, s, s1, e1, e2 = (None if t is None else t[:1] for t in out) if one else out
        return y, s, *stats(s1, e1, e2, x.shape[-1], eps)  # mean and rstd from the row sums: N values, eagerly

    def bwd(self, dy, x, mean, rstd, w, ds, *, rms):
        if x.shape[0] != 1:
            return _run(bwd, _label(rms, ds is not None, "bwd"), dy, x, mean, rstd, w, ds, rms)
        # the second row's upstream gradient is zero: it adds exact zeros to dweight and dbias, as the zero rows
        # that pad the weights' row blocks do
        dx, dw, db = _run(bwd, _label(rms, ds is not None, "bwd"), _two_rows(dy, zero=True), _two_rows(x),
                          _two_rows(mean), _two_rows(rstd), w, _two_rows(ds, zero=True), rms)
        return dx[:1], dw, db


def _two_rows(t: torch.Tensor | None, *, zero: bool = False) -> torch.Tensor | None:
    """A one-row ``t`` as two rows: itself, then itself again (or zeros). dynamo compiles a size of 1 apart from
    larger ones, and inductor's code for the two compilations (its vector width, chosen from the first row
    length each met) summed a row in another order: a row alone came out 1 ulp from the same row in a batch.
    Run as two rows, it goes through the batch's compilation."""
    if t is None:
        return None
    return torch.cat([t, torch.zeros_like(t) if zero else t])
