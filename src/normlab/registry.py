"""Norms and placements by name: ``make_norm(name, dim)``, ``NORMS``, ``PLACEMENTS``."""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ._checks import BadValue, check_choice, check_count, unknown_keywords
from .batchnorm import MaskedBatchNorm
from .norms import DyT, LayerNorm, RMSNorm, ScaleNorm

#: norm name -> constructor ``(dim, **kw)``
NORMS: dict[str, Callable[..., nn.Module]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "scalenorm": ScaleNorm,
    "dyt": DyT,
    "batchnorm": MaskedBatchNorm,
    # its size checked as the others' are; no arguments (an unknown norm_kw is refused, as for the others)
    "none": lambda dim, device=None, dtype=None: check_count(dim, "dim") or nn.Identity(),
}

#: placement name -> what it computes for one residual unit ``x -> F``
PLACEMENTS: dict[str, str] = {
    "pre": "x + F(N(x)), and a final norm after the stack (Xiong et al. 2020)",
    "post": "N(x + F(x)) (Vaswani et al. 2017, BERT)",
    "sandwich": "x + N(F(N(x))), and a final norm (Peri-LN; Ding et al. 2021, Kim et al. 2025)",
    "deepnorm": "N(alpha * x + F(x)), alpha = (2N)^(1/4), FFN/value/output init scaled by beta = (8N)^(-1/4) "
    "(Wang et al. 2022)",
    "admin": "N(omega * x + F(x)), omega = sqrt((n+1)/ln(n+1) - 1), n = 2N (Liu et al. 2020)",
    "mixln": "post for the first floor(N/4) layers, pre for the rest, final norm (Li et al. 2024)",
}


def make_norm(name: str, dim: int, **kw) -> nn.Module:
    """Build the norm called ``name`` over a feature dim of size ``dim``.

    >>> make_norm("rmsnorm", 64)
    RMSNorm((64,), eps=None, elementwise_affine=True)
    """
    check_norm(name)
    own, unknown = unknown_keywords(NORMS[name], kw, passed=("device", "dtype"),
                                    fixed=("self", "dim", "normalized_shape", "num_features", "device", "dtype"))
    if unknown:
        of = f"{NORMS[name].__name__} (norm {name!r})" if name != "none" else "norm 'none' (no norm)"
        raise BadValue(f"{', '.join(map(repr, unknown))}: not an argument of {of}; valid: {', '.join(own) or 'none'}")
    return NORMS[name](dim, **kw)


def check_norm(name: str) -> None:
    check_choice(name, NORMS, "norm")


def check_placement(name: str) -> None:
    check_choice(name, PLACEMENTS, "placement")
