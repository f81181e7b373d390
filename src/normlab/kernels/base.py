"""The interface every kernel implementation provides, and the reference one.

A kernel works on rows: ``x`` is a contiguous ``N, D`` tensor and the
statistics are ``N, 1`` tensors in the accumulation dtype (float32, or float64
for float64 input). The autograd Functions in :mod:`normlab.kernels.autograd`
call these methods; the dispatcher in :mod:`normlab.kernels` picks the class.
"""
from __future__ import annotations

import torch

from .. import reference
from .._checks import acc_dtype

Tensor = torch.Tensor
Opt = Tensor | None


class Kernel:
    """Row-wise LayerNorm/RMSNorm forward and backward; the reference math.

    Subclasses override what they do faster. The residual-add variants are
    composed from the plain ones unless a subclass fuses them.
    """

    name = "reference"

    def supports(self, op: str, x: torch.Tensor, eps: float) -> bool:
        """Whether this kernel implements ``op`` for ``x`` under the numerics contract."""
        return True

    # -- LayerNorm ---------------------------------------------------------
    def ln_fwd(self, x: Tensor, w: Opt, b: Opt, eps: float) -> tuple[Tensor, Tensor, Tensor]:
        y, cache = reference.layer_norm_forward(x, w, b, eps)
        return y, cache.mean, cache.rstd

    def ln_bwd(self, dy: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, w: Opt) -> tuple[Tensor, Opt, Tensor]:
        return reference.layer_norm_backward(dy, reference.NormCache(x, w, mean, rstd))

    # -- RMSNorm -----------------------------------------------------------
    def rms_fwd(self, x: Tensor, w: Opt, eps: float) -> tuple[Tensor, Tensor]:
        y, cache = reference.rms_norm_forward(x, w, eps)
        return y, cache.rstd

    def rms_bwd(self, dy: Tensor, x: Tensor, rstd: Tensor, w: Opt) -> tuple[Tensor, Opt]:
        return reference.rms_norm_backward(dy, reference.NormCache(x, w, None, rstd))

    # -- residual add + norm -------------------------------------------------
    def add_ln_fwd(self, x: Tensor, r: Tensor, w: Opt, b: Opt, eps: float, s_dtype: torch.dtype):
        """Returns ``(y, s, mean, rstd)`` with ``s = x + r`` stored in ``s_dtype``."""
        s = add_residual(x, r, s_dtype)  # N, D
        y, mean, rstd = self.ln_fwd(s, w, b, eps)
        return y.to(x.dtype), s, mean, rstd

    def add_rms_fwd(self, x: Tensor, r: Tensor, w: Opt, eps: float, s_dtype: torch.dtype):
        """Returns ``(y, s, rstd)`` with ``s = x + r`` stored in ``s_dtype``."""
        s = add_residual(x, r, s_dtype)  # N, D
        y, rstd = self.rms_fwd(s, w, eps)
        return y.to(x.dtype), s, rstd

    def add_ln_bwd(self, dy: Tensor, s: Tensor, mean: Tensor, rstd: Tensor, w: Opt, ds: Opt):
        """Backward of ``add_ln_fwd``: ``(dsum, dw, db)`` where ``dsum = LN'(s)^T dy + ds``."""
        dsum, dw, db = self.ln_bwd(dy, s, mean, rstd, w)
        return (dsum if ds is None else dsum + ds), dw, db

    def add_rms_bwd(self, dy: Tensor, s: Tensor, rstd: Tensor, w: Opt, ds: Opt):
        """Backward of ``add_rms_fwd``: ``(dsum, dw)``."""
        dsum, dw = self.rms_bwd(dy, s, rstd, w)
        return (dsum if ds is None else dsum + ds), dw


def add_residual(x: Tensor, r: Tensor, s_dtype: torch.dtype) -> Tensor:
    """``x + r`` rounded once to ``s_dtype`` (the sum is formed in float32 for half inputs)."""
    if s_dtype == x.dtype and r.dtype == x.dtype:
        return x + r
    ad = acc_dtype(x.dtype)
    return (x.to(ad) + r.to(ad)).to(s_dtype)
