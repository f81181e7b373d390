"""nn.Module wrappers with torch's anatomy: LayerNorm, RMSNorm, ScaleNorm, DyT.

``LayerNorm`` and ``RMSNorm`` take torch's exact constructor arguments and
defaults and have the same parameter names, so their state_dicts load into
``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` and back.

Every norm here also takes an optional ``residual``: ``norm(x)`` is the norm
alone, as torch's; ``norm(x, residual=r)`` returns ``(y, s)`` with
``s = x + r`` and ``y = norm(s)``, the residual step of a Transformer.
LayerNorm and RMSNorm do it in one fused kernel
(:func:`normlab.functional.add_layer_norm` / ``add_rms_norm``); ScaleNorm and
DyT add, then normalize. A model hands the pending residual add to any norm
whose ``forward`` takes ``residual`` (see :mod:`normlab.nn.residual`), so a
subclass keeps the fused path.
"""
from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from . import functional as F
from ._checks import (
    BadType,
    BadValue,
    ShapeLike,
    acc_dtype,
    as_shape,
    check_device,
    check_eps,
    check_flag,
    check_input,
    check_residual,
)

__all__ = ["LayerNorm", "RMSNorm", "ScaleNorm", "DyT"]


def _init_affine(m: nn.Module, elementwise_affine: bool, bias: bool, factory_kwargs: dict) -> None:
    """Register ``weight`` (and ``bias``) of shape ``m.normalized_shape``, or None, as torch does."""
    check_flag(elementwise_affine, "elementwise_affine")  # (torch takes bias="no" as a bias)
    check_flag(bias, "bias")
    m.elementwise_affine = elementwise_affine
    if elementwise_affine:
        m.weight = nn.Parameter(torch.empty(m.normalized_shape, **factory_kwargs))
    else:
        m.register_parameter("weight", None)
    if elementwise_affine and bias:
        m.bias = nn.Parameter(torch.empty(m.normalized_shape, **factory_kwargs))
    else:
        m.register_parameter("bias", None)


def _reset_affine(m: nn.Module) -> None:
    """gamma = 1, beta = 0."""
    if m.weight is not None:
        nn.init.ones_(m.weight)
    if getattr(m, "bias", None) is not None:
        nn.init.zeros_(m.bias)


class LayerNorm(nn.Module):
    r"""Layer normalization (Ba et al. 2016), drop-in for ``torch.nn.LayerNorm``.

    .. math::
        y = \frac{x - \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}} \cdot \gamma + \beta

    Statistics are per row over the trailing ``normalized_shape`` dims (for audio
    ``[B, T, D]`` and ``normalized_shape=D``: each frame separately); biased
    variance; ``eps`` inside the square root; float32 statistics for half inputs.

    Args:
        normalized_shape: int or sequence of ints, the trailing dims to normalize.
        eps: added to the variance; finite and >= 0. Default ``1e-5``.
        elementwise_affine: learn ``weight`` (gamma, init 1) and ``bias`` (beta, init 0).
        bias: learn ``bias`` when ``elementwise_affine``. Default True.

    Shape:
        input ``(*, *normalized_shape)``; output the same.

    Example:
        >>> ln = LayerNorm(6)
        >>> ln(torch.randn(2, 4, 6) * 5 + 10).shape
        torch.Size([2, 4, 6])
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = as_shape(normalized_shape)
        check_eps(eps)
        self.eps = eps
        _init_affine(self, elementwise_affine, bias, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, input: torch.Tensor, residual: torch.Tensor | None = None):  # noqa: A002   (torch's name)
        """``layer_norm(input)``; with ``residual``: ``(layer_norm(input + residual), input + residual)``, one
        fused kernel."""
        if residual is None:
            return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        return F.add_layer_norm(input, residual, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(nn.Module):
    r"""Root-mean-square normalization (Zhang & Sennrich 2019), drop-in for ``torch.nn.RMSNorm``.

    .. math::
        y = \frac{x}{\sqrt{\frac{1}{D}\sum_j x_j^2 + \epsilon}} \cdot \gamma

    No centring: the output keeps the sign of the row's mean. ``eps=None``
    computes what ``torch.nn.RMSNorm(eps=None)`` computes in torch 2.13: the
    machine epsilon of the accumulation dtype, ``torch.finfo(torch.float32).eps``
    (1.19e-07) for float16, bfloat16 and float32 input, ``finfo(float64).eps``
    for float64. (torch's docstring says ``finfo(x.dtype).eps``, which would be
    9.8e-04 for float16; its kernels do not use that.)

    Args:
        normalized_shape: int or sequence of ints, the trailing dims to normalize.
        eps: added to the mean square; None for the default above.
        elementwise_affine: learn ``weight`` (gamma, init 1).
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = as_shape(normalized_shape)
        check_eps(eps, allow_none=True)
        self.eps = eps
        check_flag(elementwise_affine, "elementwise_affine")
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory_kwargs))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``rms_norm(x)``; with ``residual``: ``(rms_norm(x + residual), x + residual)``, one fused kernel."""
        if residual is None:
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return F.add_rms_norm(x, residual, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)


class _AddThenNorm:
    """``forward(x, residual=None)`` for norms without a fused kernel: ``y``, or ``(norm(x + r), x + r)``."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._norm(x)
        if not (isinstance(residual, torch.Tensor) and residual.dtype.is_floating_point):  # (a bool mask was
            got = residual.dtype if isinstance(residual, torch.Tensor) else type(residual).__name__  # added as 0/1)
            raise BadType(f"residual must be a floating-point tensor, got {got}")
        check_residual(residual, x)
        check_device(residual, x, "residual")
        s = x + residual
        return self._norm(s), s


class ScaleNorm(_AddThenNorm, nn.Module):
    r"""ScaleNorm (Nguyen & Salazar 2019): one learned scalar over the unit vector.

    .. math::
        y = g \cdot \frac{x}{\max(\lVert x \rVert_2, \epsilon)}

    The norm is taken over the trailing ``normalized_shape`` dims; ``g`` is a
    single scalar initialised to ``sqrt(D)`` so the output starts with unit
    root-mean-square, like RMSNorm.

    Args:
        normalized_shape: int or sequence of ints.
        eps: lower bound on the norm; finite and >= 0. Default ``1e-5``. At ``eps=0`` a zero row gives 0.
    """

    __constants__ = ["normalized_shape", "eps"]

    def __init__(self, normalized_shape: ShapeLike, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = as_shape(normalized_shape)
        check_eps(eps)
        self.eps = eps
        self.g = nn.Parameter(torch.empty((), device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.g, math.sqrt(math.prod(self.normalized_shape)))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self.normalized_shape)
        check_eps(self.eps)  # as LayerNorm and RMSNorm do: an eps set after construction is checked too
        dims = tuple(range(-len(self.normalized_shape), 0))
        xa = x.to(acc_dtype(x.dtype))  # *, D   float32 (float64) arithmetic
        norm = torch.linalg.vector_norm(xa, dim=dims, keepdim=True).clamp(min=self.eps)  # *, 1
        # a zero row at eps = 0 gives 0, not 0 * inf = NaN (a padded frame's NaN reaches the valid frames through
        # attention); the inner where keeps its gradient finite too
        some = norm > 0
        scale = torch.where(some, self.g / torch.where(some, norm, torch.ones_like(norm)), torch.zeros_like(norm))
        return (xa * scale).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class DyT(_AddThenNorm, nn.Module):
    r"""Dynamic Tanh (Zhu et al. 2025): an element-wise stand-in for a norm.

    .. math::
        y = \gamma \odot \tanh(\alpha x) + \beta

    ``alpha`` is one learned scalar (init ``alpha_init``, 0.5 by default); no
    statistics are computed, so the output of one element never depends on the
    others.

    Args:
        normalized_shape: int or sequence of ints, the shape of ``gamma``/``beta``.
        alpha_init: initial ``alpha``. Default 0.5.
        elementwise_affine: learn ``weight`` (gamma, init 1) and ``bias`` (beta, init 0).
        bias: learn ``bias`` when ``elementwise_affine``.
    """

    __constants__ = ["normalized_shape", "alpha_init", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape: ShapeLike,
        alpha_init: float = 0.5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = as_shape(normalized_shape)
        if isinstance(alpha_init, bool) or not isinstance(alpha_init, numbers.Real):  # math's "must be real number"
            raise BadType(f"alpha_init must be a number, got {type(alpha_init).__name__}")
        if not math.isfinite(alpha_init):
            raise BadValue(f"alpha_init must be finite, got {alpha_init}")
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.empty((), **factory_kwargs))
        _init_affine(self, elementwise_affine, bias, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        _reset_affine(self)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self.normalized_shape)
        y = torch.tanh(self.alpha * x)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, alpha_init={self.alpha_init}, elementwise_affine={self.elementwise_affine}"
