"""torch's own fused LayerNorm kernels (aten.native_layer_norm and its backward), float32 and float64.

On CPU these are already close to the memory limit for float32/float64 and
satisfy the numerics contract there (float32 statistics, Welford-style row
moments, one thread per row). Half precision is not run here: torch's CPU
kernel returns its statistics in the input dtype (a backward from them would
not hold the contract), and its forward computes ``x * rstd - mean * rstd``,
so a constant row of large values does not give the bias (a bfloat16 row of
30000 with D = 1 came out 0.44 off; the contract says exactly the bias). It
has no RMSNorm; the residual-add variant is the eager add, then the kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import acc_dtype, eps_vanishes
from .base import OP_SPECS, Kernel, add_residual

FULL = (torch.float32, torch.float64)


def _params(s: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None):
    """``w, b`` as torch's kernel takes them for rows ``s``: both in the rows' dtype. Any other mix (float32
    rows with bfloat16 or float64 weights; a half weight beside a float32 bias) is converted to the
    accumulation dtype, as the C++ kernels do: exact for half weights, float64 ones rounded to float32 as
    there."""
    if (w is None or w.dtype == s.dtype) and (b is None or b.dtype == s.dtype):
        return w, b
    ad = acc_dtype(s.dtype)
    return (None if w is None else w.to(ad)), (None if b is None else b.to(ad))


class NativeKernel(Kernel):
    name = "native"

    def supports(self, op: str, x: torch.Tensor, eps: float) -> bool:
        # eps == 0 (or one that vanishes in float32) is excluded: torch's kernel gives NaN for a constant row
        # there, the contract gives bias.
        if OP_SPECS[op].rms or eps_vanishes(eps, x.dtype):
            return False
        return x.dtype in FULL

    def fwd(self, x, residual, w, b, eps, *, rms, s_dtype=None):
        s = x if residual is None else add_residual(x, residual, s_dtype or x.dtype)  # N, D
        y, mean, rstd = torch.native_layer_norm(s, [s.shape[-1]], *_params(s, w, b), eps)  # N, D; N, 1; N, 1
        return (y if y.dtype == x.dtype else y.to(x.dtype)), (None if residual is None else s), mean, rstd

    def run(self, x, residual, shape, w, b, eps, s_dtype):
        """The whole op on the caller's tensors: ``torch.nn.functional.layer_norm`` over ``shape``.

        The same aten kernel pair as :meth:`fwd` and :meth:`bwd` (the same bits), without reshaping to rows,
        and differentiated, where autograd records, by torch's own C++ node instead of normlab's Function: a
        call costs about what torch's does (the Function adds ~50 µs a call, the reshapes ~10 µs). Returns
        ``y``, or ``(y, s)``, shaped like ``x``.
        """
        s = x if residual is None else add_residual(x, residual, s_dtype)
        y = F.layer_norm(s, shape, *_params(s, w, b), eps)
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y if residual is None else (y, s)

    def bwd(self, dy, x, mean, rstd, w, ds, *, rms):
        mask = [True, w is not None, True]
        w, _ = _params(x, w, None)
        # torch computes dbias only when given a bias; its values are not used, so any D-vector does
        b = x.new_empty(x.shape[-1], dtype=x.dtype if w is None else w.dtype)
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy.to(x.dtype), x, [x.shape[-1]], mean, rstd, w, b, mask)
        return (dx if ds is None else dx + ds), dw, db
