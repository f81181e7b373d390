"""Placement rules: which norm slots a unit fills, its residual scale, the init, the final norm.

Every model in :mod:`normlab.models` asks this module, and only this module:

========  ======  ======  =====  ==============================
placement pre     branch  post   alpha
========  ======  ======  =====  ==============================
pre       yes                    1
post                      yes    1
sandwich  yes     yes            1
deepnorm                  yes    (2N)^(1/4)
admin                     yes    sqrt((n+1)/ln(n+1) - 1), n=2N
mixln     post for layers < floor(N/4), pre after
========  ======  ======  =====  ==============================

A stack (or a Conformer block) whose last unit is pre-style ends un-normalized,
so it gets a final norm (:func:`final_norm`). DeepNorm scales the init of the
"value-like" matrices (value and output projections, FFN, convolution module)
by ``beta = (8N)^(-1/4)``; queries and keys keep gain 1 (:func:`init_block`).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import check_choice
from ..nn.residual import ResidualUnit, Slots
from ..registry import check_placement, make_norm

#: weight initialisations: torch's defaults, or Xavier-normal with zero biases (Xiong et al.'s setting)
INITS = ("torch", "xavier")


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
    """The norm slots and residual scale of every unit of layer ``layer_index``."""
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


def final_norm(norm: str, dim: int, placement: str, n_layers: int, norm_kw: dict | None = None) -> nn.Module | None:
    """The norm that closes a stack of ``n_layers`` with ``placement``, or None where it ends normalized."""
    return make_norm(norm, dim, **(norm_kw or {})) if has_final_norm(placement, n_layers) else None


def init_linear(m: nn.Linear, gain: float, scheme: str) -> None:
    """``xavier``: Xavier-normal weights times ``gain`` and zero biases; ``torch``: torch's init times ``gain``."""
    if scheme == "xavier":
        nn.init.xavier_normal_(m.weight, gain=gain)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif gain != 1.0:
        with torch.no_grad():
            m.weight.mul_(gain)


def check_init(init: str) -> None:
    check_choice(init, INITS, "init")


def init_block(block: nn.Module, placement: str, n_layers: int, init: str) -> None:
    """Initialise every residual unit's matrices in ``block`` by ``init``, DeepNorm's beta included.

    A unit's sublayer declares its matrices through ``init_groups() -> (unscaled, scaled)``.
    """
    check_init(init)
    beta = deepnorm_beta(n_layers) if placement == "deepnorm" else 1.0
    for unit in block.modules():
        if isinstance(unit, ResidualUnit) and hasattr(unit.fn, "init_groups"):
            unscaled, scaled = unit.fn.init_groups()
            for m in unscaled:
                init_linear(m, 1.0, init)
            for m in scaled:
                init_linear(m, beta, init)
