"""The interface every kernel implementation provides, and the reference one.

A kernel has the two entry points of the C++ kernels (``cpu_kernels.cpp``):

* ``fwd(x, residual, w, b, eps, *, rms, s_dtype)`` returns ``(y, s, mean, rstd)``:
  ``s = x + residual`` (None without a residual), ``y = norm(s)`` in the dtype
  of ``x``, and the per-row statistics the backward needs (``mean`` is None for
  RMSNorm);
* ``bwd(dy, x, mean, rstd, w, ds, *, rms)`` returns ``(dx, dw, db)``:
  ``dx = norm'(x)^T dy (+ ds)``, where ``x`` is what the forward normalized
  (``s`` for the add ops) and ``ds`` the gradient reaching ``s`` directly;
  ``dw`` is None without a weight, ``db`` None for RMSNorm;
* ``bwd_pair``, the same with ``dx`` twice, for the add ops' two inputs;
* ``infer``, ``fwd`` without the statistics, where no backward follows.

Rows are contiguous ``N, D`` tensors; statistics are ``N, 1`` tensors in the
accumulation dtype (float32, or float64 for float64 input). The one autograd
Function (:mod:`normlab.kernels.autograd`) calls these; the dispatcher
(:mod:`normlab.kernels.dispatch`) picks the kernel. The numerics every kernel
keeps are in ``docs/numerics.md``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import reference
from .._checks import acc_dtype

Tensor = torch.Tensor
Opt = Tensor | None


class Op(NamedTuple):
    """What an op name means to a kernel."""

    name: str
    rms: bool  # RMSNorm (no centring, no bias) rather than LayerNorm
    add: bool  # a residual is added first and the sum ``s`` is returned too


#: the public ops, by name
OP_SPECS: dict[str, Op] = {
    o.name: o
    for o in (Op("layer_norm", False, False), Op("rms_norm", True, False),
              Op("add_layer_norm", False, True), Op("add_rms_norm", True, True))
}


class Kernel:
    """Row-wise LayerNorm/RMSNorm forward and backward; the reference math."""

    name = "reference"

    def supports(self, op: str, x: Tensor, eps: float) -> bool:
        """Whether this kernel implements ``op`` for ``x`` under the numerics contract, here and now."""
        return True

    def accepts(self, op: str, x: Tensor, eps: float) -> bool:
        """Whether ``op`` on ``x`` is a call this kernel is defined for, whether or not this machine can run it
        now: what a forced ``impl`` is checked against under a tracer or compiler, where the plain or the
        fused math runs instead (a kernel that needs a build or inductor is not ready there)."""
        return self.supports(op, x, eps)

    def fwd(self, x: Tensor, residual: Opt, w: Opt, b: Opt, eps: float, *, rms: bool,
            s_dtype: torch.dtype | None = None) -> tuple[Tensor, Opt, Opt, Tensor]:
        """``(y, s, mean, rstd)``; ``s = x + residual`` is stored in ``s_dtype`` (default: the dtype of ``x``)."""
        s = x if residual is None else add_residual(x, residual, s_dtype or x.dtype)  # N, D
        if rms:
            y, cache = reference.rms_norm_forward(s, w, eps)
        else:
            y, cache = reference.layer_norm_forward(s, w, b, eps)
        return y.type_as(x), (None if residual is None else s), cache.mean, cache.rstd

    def infer(self, x: Tensor, residual: Opt, w: Opt, b: Opt, eps: float, *, rms: bool,
              s_dtype: torch.dtype | None = None) -> tuple[Tensor, Opt]:
        """``(y, s)``: :meth:`fwd` where no backward follows (nothing records the call), so no statistics are
        kept; kernels that can skip writing them do (each is a tensor allocated, ~1 µs of a small call)."""
        y, s, _, _ = self.fwd(x, residual, w, b, eps, rms=rms, s_dtype=s_dtype)
        return y, s

    def bwd(self, dy: Tensor, x: Tensor, mean: Opt, rstd: Tensor, w: Opt, ds: Opt, *,
            rms: bool) -> tuple[Tensor, Opt, Opt]:
        """``(dx, dw, db)`` with ``dx = norm'(x)^T dy + ds``."""
        cache = reference.NormCache(x, w, mean, rstd)
        if rms:
            (dx, dw), db = reference.rms_norm_backward(dy, cache, ds), None
        else:
            dx, dw, db = reference.layer_norm_backward(dy, cache, ds)
        return dx, dw, db

    def bwd_pair(self, dy: Tensor, x: Tensor, mean: Opt, rstd: Tensor, w: Opt, ds: Opt, *,
                 rms: bool) -> tuple[Tensor, Tensor, Opt, Opt]:
        """``(dx, dx2, dw, db)``: the add ops' gradient for both the input and the residual, which are equal.
        Each input's ``.grad`` must be a tensor of its own, so autograd copies a gradient it is given twice (a
        read and a write of the input's size); a kernel that writes the second copy in its own pass saves most of
        that. Here, and in kernels that do not, ``dx2`` is ``dx`` itself."""
        dx, dw, db = self.bwd(dy, x, mean, rstd, w, ds, rms=rms)
        return dx, dx, dw, db


def add_residual(x: Tensor, r: Tensor, s_dtype: torch.dtype) -> Tensor:
    """``x + r`` rounded once to ``s_dtype``: the sum is formed in the wider of the accumulation dtype and the
    residual's (float32 for half inputs; float64 for a float64 residual, which is not rounded first)."""
    if s_dtype == x.dtype and r.dtype == x.dtype:
        return x + r
    ad = torch.promote_types(acc_dtype(x.dtype), r.dtype)
    return (x.to(ad) + r.to(ad)).to(s_dtype)
