"""autograd Functions around a kernel: save only the input and per-row stats.

The forward saves ``x`` (or the residual sum ``s``), ``weight`` and the per-row
``mean``/``rstd``; nothing of the input's size is kept besides the input itself.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .base import Kernel


def _param_grad(g: torch.Tensor | None, p: torch.Tensor | None, needed: bool):
    if not needed or g is None or p is None:
        return None
    return g.to(p.dtype)


class NormFunction(torch.autograd.Function):
    """y = norm(x) on ``N, D`` rows; LayerNorm or, with ``rms=True``, RMSNorm."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, rms: bool, k: Kernel):
        if rms:
            y, rstd = k.rms_fwd(x, weight, eps)
            mean = None
        else:
            y, mean, rstd = k.ln_fwd(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.rms, ctx.kernel = rms, k
        ctx.b_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        k = ctx.kernel
        dy = dy.contiguous()
        if ctx.rms:
            dx, dw = k.rms_bwd(dy, x, rstd, weight)
            db = None
        else:
            dx, dw, db = k.ln_bwd(dy, x, mean, rstd, weight)
        need = ctx.needs_input_grad
        return (
            dx if need[0] else None,
            _param_grad(dw, weight, need[1]),
            db.to(ctx.b_dtype) if need[2] and db is not None else None,
            None,
            None,
            None,
        )


class AddNormFunction(torch.autograd.Function):
    """(y, s) with s = x + residual and y = norm(s), on ``N, D`` rows."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps: float, rms: bool, s_dtype: torch.dtype, k: Kernel):
        if rms:
            y, s, rstd = k.add_rms_fwd(x, residual, weight, eps, s_dtype)
            mean = None
        else:
            y, s, mean, rstd = k.add_ln_fwd(x, residual, weight, bias, eps, s_dtype)
        ctx.save_for_backward(s, weight, mean, rstd)
        ctx.rms, ctx.kernel = rms, k
        ctx.x_dtype, ctx.r_dtype, ctx.b_dtype = x.dtype, residual.dtype, None if bias is None else bias.dtype
        return y, s

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, ds):
        s, weight, mean, rstd = ctx.saved_tensors
        k = ctx.kernel
        dy = dy.contiguous()
        ds = None if ds is None else ds.contiguous()  # s is also an output: its gradient flows through
        if ctx.rms:
            dsum, dw = k.add_rms_bwd(dy, s, rstd, weight, ds)
            db = None
        else:
            dsum, dw, db = k.add_ln_bwd(dy, s, mean, rstd, weight, ds)
        need = ctx.needs_input_grad
        return (
            dsum.to(ctx.x_dtype) if need[0] else None,
            dsum.to(ctx.r_dtype) if need[1] else None,
            _param_grad(dw, weight, need[2]),
            db.to(ctx.b_dtype) if need[3] and db is not None else None,
            None,
            None,
            None,
            None,
        )
