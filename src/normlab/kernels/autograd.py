"""The autograd Function around a kernel: saves only the input and per-row stats.

The forward saves what was normalized (``x``, or the residual sum ``s``), the
weight and the per-row ``mean``/``rstd``; nothing of the input's size is kept
besides the input itself.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .base import Kernel


class NormFunction(torch.autograd.Function):
    """``y = norm(x)`` on ``N, D`` rows, or with a residual ``(y, s)``, ``s = x + residual``, ``y = norm(s)``.

    LayerNorm, or RMSNorm with ``rms=True``; ``s_dtype`` is the dtype ``s`` is stored in.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps: float, rms: bool, s_dtype, k: Kernel):
        y, s, mean, rstd = k.fwd(x, residual, weight, bias, eps, rms=rms, s_dtype=s_dtype)
        ctx.save_for_backward(x if s is None else s, weight, mean, rstd)
        ctx.rms, ctx.kernel, ctx.add = rms, k, residual is not None
        ctx.dtypes = (x.dtype, None if residual is None else residual.dtype,
                      None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        return y if s is None else (y, s)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, ds=None):
        s, weight, mean, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        ds = None if ds is None else ds.contiguous()  # s is also an output: its gradient flows through
        dsum, dw, db = ctx.kernel.bwd(dy, s, mean, rstd, weight, ds, rms=ctx.rms)
        need = ctx.needs_input_grad
        x_dt, r_dt, w_dt, b_dt = ctx.dtypes
        return (
            dsum.to(x_dt) if need[0] else None,
            dsum.to(r_dt) if need[1] and ctx.add else None,
            dw.to(w_dt) if need[2] and dw is not None else None,
            db.to(b_dt) if need[3] and db is not None else None,
            None,
            None,
            None,
            None,
        )
