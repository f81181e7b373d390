"""The residual unit: one sublayer ``F`` and three named norm slots.

A unit computes ``x -> [post_norm](alpha * x + scale * drop([branch_norm](F([pre_norm](x)))))``:

* ``pre_norm``: before the branch, ``F(N(x))`` (Pre-Norm);
* ``branch_norm``: on the branch output, ``N(F(.))`` (sandwich / Peri-LN);
* ``post_norm``: after the residual add, ``N(alpha * x + F)`` (the Post-Norm family).

Which slots are filled, and ``alpha``, is the placement; the rules live in
:mod:`normlab.models.placement`, the only place that decides them.

Units and blocks pass the stream as a pair ``(hidden, residual)``, vLLM's
decoder-layer convention: the stream is ``hidden + residual``, where
``residual`` is None when no add is pending (``hidden`` is then the stream
itself). ``unit(hidden, residual, mask)`` returns the next pair. A unit that
starts with a norm hands the pending add to that norm, ``norm(hidden,
residual=residual)``, which returns ``(normalized, stream)``; a unit that ends
with a norm hands it its own ``alpha * x + F`` the same way and leaves nothing
pending. Every norm is called as a module, so its forward hooks fire; norms
whose ``forward`` takes ``residual`` (LayerNorm and RMSNorm: one fused kernel)
add it themselves, whatever their class, and the others get the sum. A norm
that a hook watches gets the sum too, as ``torch.nn.LayerNorm`` would: its
hooks see the stream and return the normalized tensor. The add itself is the
unit's ``add`` module (:class:`ResidualAdd`), called only while a hook watches
it: a hook there sees the branch output and the stream apart.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from .._checks import BadType, check_residual
from ..registry import make_norm
from .hooks import idle_dropout, watched

#: ``(hidden, residual)``: the stream is ``hidden + residual``; ``residual`` None when no add is pending
Carry = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class Slots:
    pre: bool = False  # norm before the branch
    branch: bool = False  # norm on the branch output
    post: bool = False  # norm after the residual add
    alpha: float = 1.0  # residual scale: s = alpha * x + F(...)


_TAKES_RESIDUAL: dict[type, bool] = {}


def takes_residual(norm: nn.Module) -> bool:
    """True when ``norm``'s ``forward`` has a ``residual`` parameter: it then does the residual add itself. A
    ``forward`` replaced on the instance (a user's patch, accelerate's offloading wrapper) is called as
    ``torch.nn.LayerNorm``'s is, on the sum: its signature is the replacement's to choose."""
    if "forward" in norm.__dict__:
        return False
    cls = type(norm)
    known = _TAKES_RESIDUAL.get(cls)
    if known is None:
        known = _TAKES_RESIDUAL[cls] = "residual" in inspect.signature(cls.forward).parameters
    return known


def apply_norm(norm: nn.Module | None, x: torch.Tensor, mask: torch.Tensor | None, **kw):
    """Call ``norm`` (None: identity), passing the padding mask to norms that use one, and ``kw``."""
    if norm is None:
        return x
    return norm(x, mask, **kw) if getattr(norm, "needs_mask", False) else norm(x, **kw)


def add_norm(hidden: torch.Tensor | None, residual: torch.Tensor | None, norm: nn.Module | None,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(s), s)`` with ``s = hidden + residual`` (either None: the other alone).

    A norm that takes ``residual`` does the add itself (one fused kernel for
    LayerNorm and RMSNorm), unless a hook watches it: then, as any other norm,
    it is called on the sum, so its hooks see what they would see on
    ``torch.nn.LayerNorm`` (the stream in, the normalized stream out).
    """
    if hidden is None or residual is None:
        s = residual if hidden is None else hidden
        return apply_norm(norm, s, mask), s
    if norm is not None and takes_residual(norm) and not watched(norm):
        return apply_norm(norm, hidden, mask, residual=residual)
    check_residual(residual, hidden)
    s = hidden + residual
    return apply_norm(norm, s, mask), s


def materialize(hidden: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    """The stream ``hidden + residual`` as one tensor (either None: the other alone)."""
    if hidden is None or residual is None:
        return residual if hidden is None else hidden
    check_residual(residual, hidden)
    return hidden + residual


class ResidualUnit(nn.Module):
    """One residual unit around ``fn`` with named norm slots (see the module docstring).

    Args:
        fn: the sublayer, called as ``fn(h, key_padding_mask)``.
        dim: feature size. norm: registry name. slots: which norms exist and ``alpha``.
        scale: branch multiplier (0.5 for the Conformer's half-step FFNs).
        dropout: on the branch output, before the add.
        norm_kw: extra arguments for :func:`normlab.make_norm`.

    ``forward(hidden, residual=None, mask=None) -> (hidden, residual)``; where
    the unit has no post-norm the returned pair is ``(scale * F, alpha * x)``,
    its add left to the next norm.
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
        self.add = ResidualAdd()

    @property
    def alpha(self) -> float:
        """The residual scale (a Python number: a buffer would be left unset by ``to_empty()`` after a
        meta-device build, and rounded to float32 in a float64 model)."""
        return self.slots.alpha

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> Carry:
        if residual is not None and residual.dtype == torch.bool:
            raise BadType("the second argument is the pending residual stream; pass the padding mask as mask=")
        if self.pre_norm is not None:
            h, x = add_norm(hidden, residual, self.pre_norm, mask)  # B, T, D (x2)
        else:
            x = h = materialize(hidden, residual)  # B, T, D
        f = apply_norm(self.branch_norm, self.fn(h, mask), mask)  # B, T, D
        if not idle_dropout(self.drop):  # a no-op call skipped
            f = self.drop(f)
        if self.scale != 1.0:
            f = f * self.scale
        if self.slots.alpha != 1.0:
            x = x * self.slots.alpha
        if watched(self.add):  # the add as a module call, for its hooks (else left to a norm, or fused into it)
            s = self.add(f, x)  # B, T, D
            return (s, None) if self.post_norm is None else (apply_norm(self.post_norm, s, mask), None)
        if self.post_norm is None:
            return f, x  # the add is left to whoever norms next
        return add_norm(f, x, self.post_norm, mask)[0], None

    def extra_repr(self) -> str:
        return f"scale={self.scale}, alpha={self.slots.alpha:.4g}" if self.slots.alpha != 1.0 else f"scale={self.scale}"


class ResidualAdd(nn.Module):
    """``branch + stream``: a unit's residual add. Called as a module only while a hook watches it (its inputs are
    the branch output ``f`` and the alpha-scaled stream ``x``); otherwise the add is done by the norm after it,
    in one fused kernel with that norm where it can."""

    def forward(self, branch: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
        return branch + stream
