"""The residual unit: one sublayer ``F`` and three named norm slots.

A unit computes ``x -> [post_norm](alpha * x + scale * drop([branch_norm](F([pre_norm](x)))))``:

* ``pre_norm``: before the branch, ``F(N(x))`` (Pre-Norm);
* ``branch_norm``: on the branch output, ``N(F(.))`` (sandwich / Peri-LN);
* ``post_norm``: after the residual add, ``N(alpha * x + F)`` (the Post-Norm family).

Which slots are filled, and ``alpha``, is the placement; the rules live in
:mod:`normlab.models.placement`, the only place that decides them.

Data flow between units is an explicit pair ``(hidden, residual)``: the stream
is ``residual + hidden``, where ``hidden`` is a branch output whose residual add
is still pending (``None``: nothing pending). A unit that starts with a norm
does the pending add and its norm in one fused kernel (:func:`add_norm`); a
unit that ends with a norm does its own add and norm fused and leaves nothing
pending. A stack of units therefore fuses every junction, block boundaries and
the final norm included, and nothing (diagnostics included) switches it off.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .. import functional as F
from ..norms import LayerNorm, RMSNorm
from ..registry import make_norm

#: ``(hidden, residual)``: the stream is ``residual + hidden``; ``hidden`` None when no add is pending
Carry = tuple[torch.Tensor | None, torch.Tensor]


@dataclass(frozen=True)
class Slots:
    pre: bool  # norm before the branch
    branch: bool  # norm on the branch output
    post: bool  # norm after the residual add
    alpha: float  # residual scale: s = alpha * x + F(...)


def apply_norm(norm: nn.Module | None, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Call ``norm`` (None: identity), passing the padding mask to norms that use one."""
    if norm is None:
        return x
    return norm(x, mask) if getattr(norm, "needs_mask", False) else norm(x)


def add_norm(hidden: torch.Tensor | None, residual: torch.Tensor, norm: nn.Module | None,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(s), s)`` with ``s = residual + hidden``; one fused kernel for LayerNorm and RMSNorm.

    ``hidden`` None means nothing is pending: ``s = residual``.
    """
    if hidden is None:
        return apply_norm(norm, residual, mask), residual
    if type(norm) is LayerNorm:
        return F.add_layer_norm(residual, hidden, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    if type(norm) is RMSNorm:
        return F.add_rms_norm(residual, hidden, norm.normalized_shape, norm.weight, norm.eps)
    s = residual + hidden
    return apply_norm(norm, s, mask), s


def materialize(hidden: torch.Tensor | None, residual: torch.Tensor) -> torch.Tensor:
    """The stream ``residual + hidden`` as one tensor."""
    return residual if hidden is None else residual + hidden


class ResidualUnit(nn.Module):
    """One residual unit around ``fn`` with named norm slots (see the module docstring).

    Args:
        fn: the sublayer, called as ``fn(h, key_padding_mask)``.
        dim: feature size. norm: registry name. slots: which norms exist and ``alpha``.
        scale: branch multiplier (0.5 for the Conformer's half-step FFNs).
        dropout: on the branch output, before the add.
        norm_kw: extra arguments for :func:`normlab.make_norm`.

    ``recorder``, when set (diagnostics), is called as ``recorder(unit, x, f)``
    with the unit's input stream ``x`` and branch output ``f``; it observes and
    never changes the computation.
    """

    def __init__(self, fn: nn.Module, dim: int, norm: str, slots: Slots, *, scale: float = 1.0,
                 dropout: float = 0.0, norm_kw: dict | None = None):
        super().__init__()
        kw = norm_kw or {}
        self.fn = fn
        self.slots = slots
        self.scale = scale
        self.pre_norm = make_norm(norm, dim, **kw) if slots.pre else None
        self.branch_norm = make_norm(norm, dim, **kw) if slots.branch else None
        self.post_norm = make_norm(norm, dim, **kw) if slots.post else None
        self.drop = nn.Dropout(dropout)
        self.register_buffer("alpha", torch.tensor(slots.alpha), persistent=False)
        self.recorder: Callable | None = None

    def step(self, hidden: torch.Tensor | None, residual: torch.Tensor, mask: torch.Tensor | None = None) -> Carry:
        """The carry form: ``(hidden, residual)`` in, ``(hidden, residual)`` out."""
        if self.pre_norm is not None:
            h, x = add_norm(hidden, residual, self.pre_norm, mask)  # B, T, D (x2)
        else:
            x = h = materialize(hidden, residual)  # B, T, D
        f = apply_norm(self.branch_norm, self.fn(h, mask), mask)  # B, T, D
        if self.drop.p and self.training:
            f = self.drop(f)
        if self.scale != 1.0:
            f = f * self.scale
        if self.slots.alpha != 1.0:
            x = x * self.alpha.to(x.dtype)
        if self.recorder is not None:
            self.recorder(self, x, f)
        if self.post_norm is None:
            return f, x  # the add is left to whoever norms next
        return None, add_norm(f, x, self.post_norm, mask)[0]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return materialize(*self.step(None, x, mask))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # files written before the slots were named store the unit's own norm as "norm."
        old = prefix + "norm."
        slot = "pre_norm." if self.pre_norm is not None else "post_norm."
        for key in [k for k in state_dict if k.startswith(old)]:
            state_dict[prefix + slot + key[len(old):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, alpha={self.slots.alpha:.4g}" if self.slots.alpha != 1.0 else f"scale={self.scale}"
