"""torch's own fused LayerNorm kernels (aten.native_layer_norm and its backward).

On CPU these are already close to the memory limit for float32/float64 and
satisfy the numerics contract there (float32 statistics, Welford-style row
moments, one thread per row). For float16/bfloat16 the CPU kernel returns its
statistics in the input dtype, so normlab does not use it for half inputs.
It has no RMSNorm and no residual-add variant.
"""
from __future__ import annotations

import torch

from .base import Kernel


class NativeKernel(Kernel):
    name = "native"

    def supports(self, op: str, x: torch.Tensor, eps: float) -> bool:
        # eps == 0 is excluded: torch gives NaN for a constant row there, the contract gives bias.
        return op in ("layer_norm", "add_layer_norm") and x.dtype in (torch.float32, torch.float64) and eps > 0

    def ln_fwd(self, x, w, b, eps):
        y, mean, rstd = torch.native_layer_norm(x, [x.shape[-1]], w, b, eps)  # N, D; N, 1; N, 1
        return y, mean, rstd

    def ln_bwd(self, dy, x, mean, rstd, w):
        mask = [True, w is not None, True]
        # torch computes dbias only when given a bias; its values are not used, so any D-vector does
        b = x.new_empty(x.shape[-1])
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b, mask)
        return dx, dw, db
