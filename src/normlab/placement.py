"""Where the norm goes: the residual unit, defined in one place.

A residual unit wraps one sublayer ``F`` (attention, feed-forward, convolution)
and has three norm slots (x-transformers' view, without its flags):

* ``pre``: before the branch, ``F(N(x))``;
* ``branch``: on the branch output, ``N(F(.))`` (sandwich / Peri-LN);
* ``main``: after the residual add, ``N(alpha * x + F)`` (the post family).

A placement is just which slots are filled and the residual scale ``alpha``:

========  ======  ======  =====  ==============================
placement pre     branch  main   alpha
========  ======  ======  =====  ==============================
pre       yes                    1
post                      yes    1
sandwich  yes     yes            1
deepnorm                  yes    (2N)^(1/4)
admin                     yes    sqrt((n+1)/ln(n+1) - 1), n=2N
mixln     post for layers < floor(N/4), pre after
========  ======  ======  =====  ==============================
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import functional as F
from .norms import LayerNorm, RMSNorm
from .registry import check_placement, make_norm


@dataclass(frozen=True)
class Slots:
    pre: bool  # norm before the branch
    branch: bool  # norm on the branch output
    main: bool  # norm after the residual add
    alpha: float  # residual scale: s = alpha * x + F(...)


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet encoder residual scale: alpha = (2N)^(1/4)."""
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet encoder init gain for FFN, value and output projections: beta = (8N)^(-1/4)."""
    return (8 * n_layers) ** -0.25


def admin_omega(n_layers: int) -> float:
    """Admin's closed-form residual scale for n = 2N residual units: sqrt((n+1)/ln(n+1) - 1)."""
    n = 2 * n_layers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


def layer_placement(placement: str, layer_index: int, n_layers: int) -> str:
    """The plain placement used by layer ``layer_index`` (only mixln varies by layer)."""
    check_placement(placement)
    if placement == "mixln":
        return "post" if layer_index < math.floor(0.25 * n_layers) else "pre"
    return placement


def slots(placement: str, layer_index: int = 0, n_layers: int = 1) -> Slots:
    p = layer_placement(placement, layer_index, n_layers)
    if p == "pre":
        return Slots(True, False, False, 1.0)
    if p == "sandwich":
        return Slots(True, True, False, 1.0)
    if p == "post":
        return Slots(False, False, True, 1.0)
    if p == "deepnorm":
        return Slots(False, False, True, deepnorm_alpha(n_layers))
    return Slots(False, False, True, admin_omega(n_layers))  # admin


def has_final_norm(placement: str, n_layers: int) -> bool:
    """Pre-style stacks end un-normalized, so they get a final norm."""
    return layer_placement(placement, n_layers - 1, n_layers) in ("pre", "sandwich")


def apply_norm(norm: nn.Module | None, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Call ``norm`` (None: identity), passing the padding mask to norms that use one."""
    if norm is None:
        return x
    return norm(x, mask) if getattr(norm, "needs_mask", False) else norm(x)


def _fusable(norm: nn.Module | None) -> bool:
    return type(norm) in (LayerNorm, RMSNorm)


def add_and_norm(x: torch.Tensor, f: torch.Tensor, norm: nn.Module, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + f), x + f)``, fused in one kernel for LayerNorm/RMSNorm."""
    if type(norm) is LayerNorm:
        return F.add_layer_norm(x, f, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    if type(norm) is RMSNorm:
        return F.add_rms_norm(x, f, norm.normalized_shape, norm.weight, norm.eps)
    s = x + f
    return apply_norm(norm, s, mask), s


class Residual(nn.Module):
    """One residual unit around ``fn``: ``x -> [main](alpha * x + scale * [branch](fn([pre](x))))``.

    Args:
        fn: the sublayer, called as ``fn(h, key_padding_mask)``.
        dim: feature size. norm: registry name. slots: which norms exist.
        scale: branch multiplier (0.5 for the Conformer's half-step FFNs).
        norm_kw: extra arguments for :func:`normlab.make_norm`.
    """

    def __init__(self, fn: nn.Module, dim: int, norm: str, slots: Slots, *, scale: float = 1.0, norm_kw=None):
        super().__init__()
        kw = norm_kw or {}
        self.fn = fn
        self.slots = slots
        self.scale = scale
        # the unit's own norm: before the branch (pre family) or after the add (post family)
        self.norm = make_norm(norm, dim, **kw) if (slots.pre or slots.main) else None
        self.branch_norm = make_norm(norm, dim, **kw) if slots.branch else None
        self.register_buffer("alpha", torch.tensor(slots.alpha), persistent=False)
        self.recorder = None  # diagnostics: called as recorder(unit, x, branch, sum)

    def branch(self, x, mask=None, normed=None):
        """``scale * [branch](fn([pre](x)))``; ``normed`` replaces ``[pre](x)`` if already computed."""
        h = normed if normed is not None else (apply_norm(self.norm, x, mask) if self.slots.pre else x)
        f = apply_norm(self.branch_norm, self.fn(h, mask), mask)  # B, T, D
        return f * self.scale if self.scale != 1.0 else f

    def _residual(self, x):
        return x * self.alpha.to(x.dtype) if self.slots.alpha != 1.0 else x

    def combine(self, x, f, mask=None):
        """``[main](alpha * x + f)``; the add and the main norm are fused where possible."""
        xr = self._residual(x)
        if self.slots.main and _fusable(self.norm) and self.recorder is None:
            return add_and_norm(xr, f, self.norm, mask)[0]
        s = xr + f
        if self.recorder is not None:
            self.recorder(self, x, f, s)
        return apply_norm(self.norm, s, mask) if self.slots.main else s

    def combine_then_norm(self, x, f, next_norm, mask=None):
        """``(out, next_norm(out))`` with ``out = combine(x, f)``, fused for pre-style units."""
        if not self.slots.main and _fusable(next_norm) and self.recorder is None:
            y, s = add_and_norm(self._residual(x), f, next_norm, mask)
            return s, y
        out = self.combine(x, f, mask)
        return out, apply_norm(next_norm, out, mask)

    def forward(self, x, mask=None):
        return self.combine(x, self.branch(x, mask), mask)
