"""The autograd Function around a kernel: saves only the input and per-row stats.

The forward saves what was normalized (``x``, or the residual sum ``s``), the
weight and the per-row ``mean``/``rstd``; nothing of the input's size is kept
besides the input itself.

The backward runs the kernel's own backward. Under ``create_graph=True``
(second derivatives: gradient penalties, meta-learning) it runs the
reference's backward instead, in torch operations with ``mean``/``rstd``
recomputed from what was saved, so autograd can differentiate it again.
"""
from __future__ import annotations

import torch

from .. import reference
from .base import Kernel


class NormFunction(torch.autograd.Function):
    """``y = norm(x)`` on ``N, D`` rows, or with a residual ``(y, s)``, ``s = x + residual``, ``y = norm(s)``.

    LayerNorm, or RMSNorm with ``rms=True``; ``s_dtype`` is the dtype ``s`` is stored in.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps: float, rms: bool, s_dtype, k: Kernel):
        y, s, mean, rstd = k.fwd(x, residual, weight, bias, eps, rms=rms, s_dtype=s_dtype)
        ctx.save_for_backward(x if s is None else s, weight, mean, rstd)
        ctx.rms, ctx.kernel, ctx.add, ctx.eps = rms, k, residual is not None, eps
        ctx.dtypes = (x.dtype, None if residual is None else residual.dtype,
                      None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        if s is not None and not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            ctx.mark_non_differentiable(s)  # x + residual: with neither requiring grad, neither does s (as eager)
        return y if s is None else (y, s)

    @staticmethod
    def backward(ctx, dy, ds=None):
        s, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        x_dt, r_dt, w_dt, b_dt = ctx.dtypes
        # create_graph=True: a backward autograd can differentiate; under vmap (is_grads_batched, a vectorized
        # jacobian) the gradients are batched wrappers without storage, which only torch operations can read
        if torch.is_grad_enabled() or _batched(dy) or (ds is not None and _batched(ds)):
            dsum, dw, db = _differentiable_bwd(dy, s, weight, ds, ctx.eps, ctx.rms)
            dsum2 = dsum
        else:
            dy = dy.contiguous()
            ds = None if ds is None else ds.contiguous()  # s is also an output: its gradient flows through
            # x and the residual both get dsum: in two tensors where the kernel can write both in one pass
            if ctx.add and need[0] and need[1] and x_dt == r_dt == s.dtype:
                dsum, dsum2, dw, db = ctx.kernel.bwd_pair(dy, s, mean, rstd, weight, ds, rms=ctx.rms)
            else:
                dsum, dw, db = ctx.kernel.bwd(dy, s, mean, rstd, weight, ds, rms=ctx.rms)
                dsum2 = dsum
        return (
            dsum.to(x_dt) if need[0] else None,
            dsum2.to(r_dt) if need[1] and ctx.add else None,
            dw.to(w_dt) if need[2] and dw is not None else None,
            db.to(b_dt) if need[3] and db is not None else None,
            None,
            None,
            None,
            None,
        )


_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)


def _batched(t: torch.Tensor) -> bool:
    """Whether ``t`` is a vmap wrapper (``torch.func`` transforms, or the vmap of ``is_grads_batched`` and
    ``jacobian(vectorize=True)``): a tensor without storage of its own."""
    if torch.compiler.is_compiling():  # dynamo traces the backward: no vmap there, and it cannot trace these
        return False
    return torch._C._are_functorch_transforms_active() or _legacy_batched(t)


def _differentiable_bwd(dy, s, weight, ds, eps: float, rms: bool):
    """The reference's backward on ``N, D`` rows, in torch operations from ``s`` itself (the statistics
    recomputed, so their dependence on ``s`` is in the graph): ``(dsum, dw, db)``, ``db`` None for RMSNorm."""
    if rms:
        _, cache = reference.rms_norm_forward(s, weight, eps)
        (dx, dw), db = reference.rms_norm_backward(dy, cache, ds), None
    else:
        _, cache = reference.layer_norm_forward(s, weight, None, eps)
        dx, dw, db = reference.layer_norm_backward(dy, cache, ds)
    return dx, dw, db
