"""LayerNorm and RMSNorm written out by hand: the readable definition.

This is the teaching implementation that every fast path in normlab is checked
against. Each function works on the last dimension ``D`` of ``x`` (shape
``[..., D]``, written ``N, D`` below with ``N`` the number of rows: tokens,
frames, patches). Every line carries its shape. The derivation of the backward
passes is in ``docs/layernorm.md``; the equation numbers below refer to it.
The functions take their arguments as given, unchecked, so that each line
stays the math: a weight of another shape broadcasts as torch's arithmetic
does, a negative ``eps`` gives NaN. :mod:`normlab.functional` is the checked
entry point (one clear error for each of those).

Numerics (the contract in ``docs/numerics.md``):

* statistics in float32 for float16/bfloat16 input, float64 for float64;
* two passes (mean first, then the deviations from it), never
  ``E[x^2] - E[x]^2``, which cancels catastrophically when ``|mean| >> std``;
  the deviations' own mean corrects the first pass's rounded mean;
* biased variance (divide by ``D``), ``eps`` inside the square root;
* the backward needs only ``x`` and the per-row ``mean``/``rstd`` (plus ``weight``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._checks import acc_dtype, eps_vanishes


def to_acc(x: torch.Tensor) -> torch.Tensor:
    """``x`` in its accumulation dtype, and ``x`` itself where it already is.

    ``torch.jit.trace`` records a cast's dtype, and no cast where none ran: a norm traced in float32 ran a
    float16 input with float16 statistics. While tracing, ``x`` is added to a float32 zero of one element instead
    (made from ``x``: a graph traced on one device runs on another), which type promotion carries to the
    accumulation dtype of whatever dtype the traced graph later gets (float32 for half precision and float32,
    float64 for float64)."""
    if torch.jit.is_tracing():
        return x + x.new_zeros(1, dtype=torch.float32)  # the device is x's, not the traced one
    ad = acc_dtype(x.dtype)
    return x if x.dtype == ad else x.to(ad)


class NormCache(NamedTuple):
    """What the forward pass keeps for the backward pass."""

    x: torch.Tensor  # N, D   the input, in its own dtype
    weight: torch.Tensor | None  # D   gamma (None: no scaling)
    mean: torch.Tensor | None  # N, 1 per-row mean in the accumulation dtype (None for RMSNorm)
    rstd: torch.Tensor  # N, 1 per-row 1/sqrt(var + eps) (1/rms for RMSNorm)


def rstd_of(second_moment: torch.Tensor, eps: float) -> torch.Tensor:
    """1/sqrt(m + eps), and 0 where m + eps == 0 (a constant row with eps=0, or an eps below the smallest
    normal number of the accumulation dtype, which rounds away)."""
    if not eps_vanishes(eps, second_moment.dtype):
        return torch.rsqrt(second_moment + eps)  # N, 1
    # only then can the sum be 0: 0 * inf is defined as 0, so the row gives bias. The rsqrt reads 1 there, not
    # 0: where() passes no gradient to the branch it drops, but rsqrt'(0) = inf times that zero is NaN. An eps
    # below `tiny` that survives the addition (a subnormal, without flush-to-zero) counts, as in torch's kernel
    total = second_moment + eps  # N, 1
    zero = total == 0  # N, 1 (a NaN sum, from a NaN input, is not 0: its rstd stays NaN, as torch's does)
    rstd = torch.rsqrt(torch.where(zero, torch.ones_like(total), total))  # N, 1
    return torch.where(zero, torch.zeros_like(rstd), rstd)  # N, 1


def variance_of(mean_square: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The biased variance ``mean_square - c^2`` (deviations about the first pass's mean, ``c`` their mean),
    clamped at 0; inf where the squares overflow the accumulation dtype (``inf - inf`` gives NaN there: the
    row's rstd is then 0 and its output the bias, docs/numerics.md; a NaN input keeps its NaN through ``x - m``)."""
    var = mean_square - c * c  # N, 1
    # where(), not clamp_min(0): exported, clamp_min is ONNX's Clip, whose default upper bound is the float
    # maximum, so an overflowing row's inf became 3.4e38 there and its output values instead of the bias
    nan_or_negative = torch.where(var.isnan(), torch.full_like(var, float("inf")), torch.zeros_like(var))
    return torch.where(var > 0, var, nan_or_negative)  # N, 1


# ---------------------------------------------------------------- LayerNorm


def layer_norm_forward(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, NormCache]:
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dim.   (1)

    ``mean = sum_j x_j / D``, ``var = sum_j (x_j - mean)^2 / D`` (biased).
    Returns ``y`` in the dtype of ``x`` and the cache for :func:`layer_norm_backward`.

    The first pass's mean ``m`` is rounded: a float32 row with mean 1e4 and std 1e-2 is about 5% of its std
    away from it. The deviations ``x - m`` are exact where they are small, and their mean ``c`` corrects it:
    ``mean = m + c``, ``var = mean((x - m)^2) - c^2``, ``x_hat = ((x - m) - c) * rstd``.
    """
    xa = to_acc(x)  # N, D   statistics in float32 (float64 for float64)
    m = xa.mean(dim=-1, keepdim=True)  # N, 1   first pass
    xm = xa - m  # N, D   deviations from the rounded mean
    c = xm.mean(dim=-1, keepdim=True)  # N, 1   second pass: their mean ...
    var = variance_of((xm * xm).mean(dim=-1, keepdim=True), c)  # N, 1   ... and variance, biased
    rstd = rstd_of(var, eps)  # N, 1   1/sqrt(var + eps)
    mean = m + c  # N, 1
    y = (xm - c) * rstd  # N, D   x_hat: mean 0, variance 1 (for eps -> 0)
    if weight is not None:
        y = y * weight.type_as(y)  # N, D   gamma, broadcast over rows, in the accumulation dtype (rounded once)
    if bias is not None:
        y = y + bias.type_as(y)  # N, D   beta
    return y.type_as(x), NormCache(x, weight, mean, rstd)  # N, D   type_as: a trace follows the input's dtype


def _leading_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over every leading dim, ``(..., D) -> (D,)``; a single row ``(D,)`` as it is (torch's
    ``sum(dim=())`` sums every element: one row's weight gradient came back a scalar)."""
    return t.sum(dim=tuple(range(t.dim() - 1))) if t.dim() > 1 else t


def layer_norm_backward(
    dy: torch.Tensor, cache: NormCache, ds: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of (1) given dL/dy. Returns ``(dx, dweight, dbias)``.

    ``ds``: a gradient that reaches ``x`` directly besides (the add ops' residual sum ``s``, an output too); it
    is added to ``dx`` in the accumulation dtype, so a half-precision ``dx`` is rounded once.

    With ``x_hat = (x - mean) * rstd`` and ``g = dy * weight``:   (4)

        dx      = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
        dweight = sum over rows of dy * x_hat
        dbias   = sum over rows of dy

    ``dweight`` is ``None`` when the forward had no weight. The cache does not
    record whether there was a bias, so ``dbias`` is always returned; callers
    without a bias ignore it.
    """
    x, weight, mean, rstd = cache
    ad = acc_dtype(x.dtype)
    dya = dy.to(ad)  # N, D
    xhat = (x.to(ad) - mean) * rstd  # N, D   recomputed, not stored
    g = dya * weight.to(ad) if weight is not None else dya  # N, D   dL/dx_hat
    g_mean = g.mean(dim=-1, keepdim=True)  # N, 1
    gx_mean = (g * xhat).mean(dim=-1, keepdim=True)  # N, 1
    dx = rstd * (g - g_mean - xhat * gx_mean)  # N, D   eq. (4)
    dweight = _leading_sum(dya * xhat) if weight is not None else None  # D
    dbias = _leading_sum(dya)  # D
    return _with(dx, ds).to(x.dtype), dweight, dbias


def _with(dx: torch.Tensor, ds: torch.Tensor | None) -> torch.Tensor:
    """``dx + ds`` in ``dx``'s (accumulation) dtype; ``dx`` where there is no ``ds``."""
    return dx if ds is None else dx + ds.to(dx.dtype)


# ---------------------------------------------------------------- RMSNorm


def rms_norm_forward(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, NormCache]:
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last dim (no centring).   (5)"""
    xa = to_acc(x)  # N, D
    ms = (xa * xa).mean(dim=-1, keepdim=True)  # N, 1   mean square
    rstd = rstd_of(ms, eps)  # N, 1   1/rms
    y = xa * rstd  # N, D   x_hat: unit root-mean-square
    if weight is not None:
        y = y * weight.type_as(y)  # N, D
    return y.type_as(x), NormCache(x, weight, None, rstd)


def rms_norm_backward(
    dy: torch.Tensor, cache: NormCache, ds: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of (5). Returns ``(dx, dweight)``; ``ds`` as in :func:`layer_norm_backward`.

    With ``x_hat = x * rstd`` and ``g = dy * weight``:   (7)

        dx      = rstd * (g - x_hat * mean(g * x_hat))
        dweight = sum over rows of dy * x_hat
    """
    x, weight, _, rstd = cache
    ad = acc_dtype(x.dtype)
    dya = dy.to(ad)  # N, D
    xhat = x.to(ad) * rstd  # N, D
    g = dya * weight.to(ad) if weight is not None else dya  # N, D
    gx_mean = (g * xhat).mean(dim=-1, keepdim=True)  # N, 1
    dx = rstd * (g - xhat * gx_mean)  # N, D   eq. (7)
    dweight = _leading_sum(dya * xhat) if weight is not None else None  # D
    return _with(dx, ds).to(x.dtype), dweight
