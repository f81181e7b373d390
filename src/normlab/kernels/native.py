"""torch's own fused LayerNorm kernels (aten.native_layer_norm and its backward).

On CPU these are already close to the memory limit for float32/float64 and
satisfy the numerics contract there (float32 statistics, Welford-style row
moments, one thread per row). For float16/bfloat16 the CPU kernel computes in
float32 and rounds ``y`` once, as the contract asks, but returns its
statistics in the input dtype: a backward from them would not hold the
contract. So half inputs on CPU run here only where no backward can follow
(autograd not recording: ``no_grad``, ``inference_mode``): the forward-only
calls of inference, where its output has the C++ kernel's accuracy
(docs/numerics.md). It has no RMSNorm; the residual-add variant is the eager
add, then the kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import acc_dtype
from .base import OP_SPECS, Kernel, add_residual

FULL = (torch.float32, torch.float64)
#: run here only without autograd recording (their statistics come back in the half dtype)
HALF = (torch.float16, torch.bfloat16)


def _param(s: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor | None:
    """``p`` as torch's kernel takes it for rows ``s``: in the rows' dtype, or float32 under half rows (its
    mixed mode). Any other dtype (float32 rows with bfloat16 or float64 weights; a float32 ``s`` of half
    inputs, ``residual_in_fp32``, with half weights) is converted to the accumulation dtype, as the C++
    kernels do: exact for half weights, float64 ones rounded to float32 as there."""
    if p is None or p.dtype == s.dtype or (s.dtype in HALF and p.dtype == torch.float32):
        return p
    return p.to(acc_dtype(s.dtype))


class NativeKernel(Kernel):
    name = "native"

    def supports(self, op: str, x: torch.Tensor, eps: float) -> bool:
        # eps == 0 is excluded: torch gives NaN for a constant row there, the contract gives bias.
        if OP_SPECS[op].rms or eps <= 0:
            return False
        return x.dtype in FULL or (x.dtype in HALF and x.device.type == "cpu" and not torch.is_grad_enabled())

    def fwd(self, x, residual, w, b, eps, *, rms, s_dtype=None):
        s = x if residual is None else add_residual(x, residual, s_dtype or x.dtype)  # N, D
        y, mean, rstd = torch.native_layer_norm(s, [s.shape[-1]], _param(s, w), _param(s, b), eps)  # N, D; N, 1
        return (y if y.dtype == x.dtype else y.to(x.dtype)), (None if residual is None else s), mean, rstd

    def run(self, x, residual, shape, w, b, eps, s_dtype):
        """The whole op on the caller's tensors: ``torch.nn.functional.layer_norm`` over ``shape``.

        The same aten kernel pair as :meth:`fwd` and :meth:`bwd` (the same bits), without reshaping to rows,
        and differentiated, where autograd records, by torch's own C++ node instead of normlab's Function: a
        call costs about what torch's does (the Function adds ~50 µs a call, the reshapes ~10 µs). Returns
        ``y``, or ``(y, s)``, shaped like ``x``.
        """
        s = x if residual is None else add_residual(x, residual, s_dtype)
        y = F.layer_norm(s, shape, _param(s, w), _param(s, b), eps)
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y if residual is None else (y, s)

    def bwd(self, dy, x, mean, rstd, w, ds, *, rms):
        mask = [True, w is not None, True]
        w = _param(x, w)
        # torch computes dbias only when given a bias; its values are not used, so any D-vector does
        b = x.new_empty(x.shape[-1], dtype=x.dtype if w is None else w.dtype)
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy.to(x.dtype), x, [x.shape[-1]], mean, rstd, w, b, mask)
        return (dx if ds is None else dx + ds), dw, db
