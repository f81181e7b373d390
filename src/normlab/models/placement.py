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

:func:`plan` turns a placement into one :class:`LayerSpec` per layer (the
table above is :data:`SLOTS` and :data:`ALPHAS`); a :class:`~normlab.models.stack.Stack`
builds its blocks from them. A stack (or a Conformer block) whose last unit
is pre-style ends un-normalized, so it gets a final norm. DeepNorm scales the
init of the "value-like" matrices (value and output projections, FFN,
convolution module) by ``beta = (8N)^(-1/4)``; queries and keys keep gain 1
(:func:`init_block`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .._checks import BadValue, check_choice, check_count
from ..nn.residual import ResidualUnit, Slots
from ..registry import check_norm, check_placement, make_norm

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


#: the norm slots of every unit, per plain placement (mixln is post or pre by layer)
SLOTS: dict[str, Slots] = {
    "pre": Slots(pre=True),
    "post": Slots(post=True),
    "sandwich": Slots(pre=True, branch=True),
    "deepnorm": Slots(post=True),
    "admin": Slots(post=True),
}

#: placements that scale the residual: name -> alpha(n_layers)
ALPHAS: dict[str, Callable[[int], float]] = {"deepnorm": deepnorm_alpha, "admin": admin_omega}


def layer_placement(placement: str, layer_index: int, n_layers: int) -> str:
    """The plain placement used by layer ``layer_index`` (only mixln varies by layer)."""
    check_placement(placement)
    if placement == "mixln":
        return "post" if layer_index < math.floor(0.25 * n_layers) else "pre"
    return placement


def slots(placement: str, layer_index: int = 0, n_layers: int = 1) -> Slots:
    """The norm slots and residual scale of every unit of layer ``layer_index``."""
    p = layer_placement(placement, layer_index, n_layers)
    alpha = ALPHAS.get(p)
    return SLOTS[p] if alpha is None else replace(SLOTS[p], alpha=alpha(n_layers))


def check_init(init: str) -> None:
    check_choice(init, INITS, "init")


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a stack, as :func:`plan` decides it; a block builds its units and norms from it."""

    index: int
    n_layers: int
    placement: str  # the stack's placement name
    slots: Slots  # this layer's units' slots and alpha
    dim: int
    norm: str
    norm_kw: dict = field(default_factory=dict)
    init: str = "torch"

    @property
    def kind(self) -> str:
        """This layer's plain placement (mixln resolved)."""
        return layer_placement(self.placement, self.index, self.n_layers)

    def make_norm(self) -> nn.Module:
        """One norm of the stack's kind (a block's closing norm, the stack's final norm)."""
        return make_norm(self.norm, self.dim, **self.norm_kw)

    def unit(self, fn: nn.Module, **kw) -> ResidualUnit:
        """A residual unit around ``fn`` with this layer's slots; ``kw``: ``scale``, ``dropout``."""
        return ResidualUnit(fn, self.dim, self.norm, self.slots, norm_kw=self.norm_kw, **kw)


def plan(placement: str, n_layers: int, *, dim: int, norm: str = "layernorm", norm_kw: dict | None = None,
         init: str = "torch") -> list[LayerSpec]:
    """One :class:`LayerSpec` per layer; every argument is checked here, before anything is built."""
    check_count(n_layers, "n_layers")  # any whole number, numpy's too, as every other size
    n_layers = int(n_layers)
    check_placement(placement)
    check_norm(norm)
    check_init(init)
    kw = dict(norm_kw or {})
    return [LayerSpec(i, n_layers, placement, slots(placement, i, n_layers), dim, norm, kw, init)
            for i in range(n_layers)]


def layer_spec(placement: str, layer_index: int, n_layers: int, **kw) -> LayerSpec:
    """The spec of layer ``layer_index`` of :func:`plan` (a block built alone); ``kw`` as :func:`plan`."""
    specs = plan(placement, n_layers, **kw)
    if not 0 <= layer_index < n_layers:
        raise BadValue(f"layer_index must be in [0, {n_layers}), got {layer_index}")
    return specs[layer_index]


def init_linear(m: nn.Linear, gain: float, scheme: str) -> None:
    """``xavier``: Xavier-normal weights times ``gain`` and zero biases; ``torch``: torch's init times ``gain``."""
    if scheme == "xavier":
        nn.init.xavier_normal_(m.weight, gain=gain)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif gain != 1.0:
        with torch.no_grad():
            m.weight.mul_(gain)


def init_block(block: nn.Module, spec: LayerSpec) -> None:
    """Initialise every residual unit's matrices in ``block`` by ``spec.init``, DeepNorm's beta included.

    A unit's sublayer declares its matrices through ``init_groups() -> (unscaled, scaled)``.
    """
    beta = deepnorm_beta(spec.n_layers) if spec.placement == "deepnorm" else 1.0
    for unit in block.modules():
        if isinstance(unit, ResidualUnit) and hasattr(unit.fn, "init_groups"):
            unscaled, scaled = unit.fn.init_groups()
            for m in unscaled:
                init_linear(m, 1.0, spec.init)
            for m in scaled:
                init_linear(m, beta, spec.init)
