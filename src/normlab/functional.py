"""The public math: ``layer_norm``, ``rms_norm`` and their residual-add variants.

Each function validates its arguments and hands them to
:func:`normlab.kernels.dispatch`, the one place that decides which kernel runs
(``impl=`` forces one; ``"reference"`` is the readable definition). normlab's
kernels work on rows of length ``D = prod(normalized_shape)`` inside an
autograd Function whose backward is the hand-derived one
(``docs/layernorm.md``); torch's own (``"native"``) runs under torch's node.
"""
from __future__ import annotations

import torch

from . import kernels
from ._checks import (
    ShapeLike,
    as_shape,
    check_device,
    check_eps,
    check_flag,
    check_input,
    check_param,
    check_residual,
    default_rms_eps,
)

Tensor = torch.Tensor

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"]


def _prepare(x: Tensor, normalized_shape: ShapeLike, weight, bias, eps, *, rms: bool):
    shape = as_shape(normalized_shape)
    check_input(x, shape)
    check_param(weight, shape, "weight")
    check_param(bias, shape, "bias")
    check_device(weight, x, "weight")
    check_device(bias, x, "bias")
    if rms and eps is None:
        eps = default_rms_eps(x.dtype)
    check_eps(eps)
    return shape, float(eps)


def layer_norm(
    input: Tensor,  # noqa: A002   (torch's name: callers pass input=)
    normalized_shape: ShapeLike,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    *,
    impl: str = "auto",
) -> Tensor:
    r"""Layer normalization over the trailing ``normalized_shape`` dims of ``input`` (``x`` below).

    .. math::
        y = \frac{x - \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}} \cdot \gamma + \beta

    Mean and variance are taken per row over the last ``len(normalized_shape)``
    dims; the variance is biased (divides by ``D``); ``eps`` is inside the square
    root. Statistics are accumulated in float32 for float16/bfloat16 input
    (float64 for float64) by two passes; ``y`` has the dtype of ``x``.

    Args:
        input: ``x``, of shape ``(*, *normalized_shape)``, floating point (torch's name for it).
        normalized_shape: int or sequence of ints, the trailing dims to normalize.
        weight: ``gamma`` of shape ``normalized_shape``, or None.
        bias: ``beta`` of shape ``normalized_shape``, or None.
        eps: added to the variance, finite and >= 0.
        impl: ``"auto"`` (fastest path that satisfies the contract) or a name in
            :data:`normlab.kernels.IMPLS`.

    Shape:
        ``x``: ``(*, *normalized_shape)``; output: same shape.

    Example:
        >>> x = torch.randn(2, 4, 6)              # [B, T, D] audio frames
        >>> y = layer_norm(x, 6)
        >>> y.mean(-1).abs().max() < 1e-6
        tensor(True)
    """
    shape, eps = _prepare(input, normalized_shape, weight, bias, eps, rms=False)
    return kernels.dispatch("layer_norm", input, None, shape, weight, bias, eps, impl=impl)


def rms_norm(
    input: Tensor,  # noqa: A002   (torch's name: callers pass input=)
    normalized_shape: ShapeLike,
    weight: Tensor | None = None,
    eps: float | None = None,
    *,
    impl: str = "auto",
) -> Tensor:
    r"""Root-mean-square normalization (Zhang & Sennrich 2019): no centring.

    .. math::
        y = \frac{x}{\sqrt{\frac{1}{D}\sum_j x_j^2 + \epsilon}} \cdot \gamma

    ``eps=None`` uses what ``torch.nn.functional.rms_norm`` uses: the machine
    epsilon of the accumulation dtype, i.e. ``torch.finfo(torch.float32).eps``
    for float16/bfloat16/float32 input and ``torch.finfo(torch.float64).eps``
    for float64 (torch's docs say ``finfo(x.dtype)``; its kernels do this).

    Args and shapes as :func:`layer_norm`, without ``bias``.
    """
    shape, eps = _prepare(input, normalized_shape, weight, None, eps, rms=True)
    return kernels.dispatch("rms_norm", input, None, shape, weight, None, eps, impl=impl)


def _add_norm(x, residual, normalized_shape, weight, bias, eps, residual_in_fp32, impl, *, rms):
    check_flag(residual_in_fp32, "residual_in_fp32")  # ("no" kept s in float32)
    half = (torch.float16, torch.bfloat16)
    if isinstance(x, Tensor) and isinstance(residual, Tensor) and x.dtype.is_floating_point and \
            residual.dtype.is_floating_point and not (residual_in_fp32 and x.dtype in half):
        # y and s in the dtype eager ``norm(x + residual)`` gives: a bfloat16 branch added to a float32 stream (as
        # under autocast) is float32, exactly. With residual_in_fp32 a half x keeps y in its dtype (s is the
        # float32 stream a chain of such calls passes on as the next residual). Promoted before the checks, so
        # RMSNorm's default eps is the promoted dtype's
        dtype = torch.promote_types(x.dtype, residual.dtype)
        x = x if x.dtype == dtype else x.to(dtype)
    shape, eps = _prepare(x, normalized_shape, weight, bias, eps, rms=rms)
    check_input(residual, shape, "residual")
    check_device(residual, x, "residual")
    check_residual(residual, x)
    s_dtype = torch.float32 if residual_in_fp32 and x.dtype in half else torch.promote_types(x.dtype, residual.dtype)
    op = "add_rms_norm" if rms else "add_layer_norm"
    return kernels.dispatch(op, x, residual, shape, weight, bias, eps, impl=impl, s_dtype=s_dtype)


def add_layer_norm(
    x: Tensor,
    residual: Tensor,
    normalized_shape: ShapeLike,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    *,
    residual_in_fp32: bool = False,
    impl: str = "auto",
) -> tuple[Tensor, Tensor]:
    """``s = x + residual``; ``y = layer_norm(s)``. Returns ``(y, s)``.

    The Pre-Norm residual step: ``s`` is the new residual stream and ``y`` the
    normalized input of the next sublayer. ``residual`` must have the shape of
    ``x`` (no broadcasting). ``y`` and ``s`` have the dtype ``x + residual`` has
    in torch (a float16/bfloat16 ``x`` added to a float32 stream gives float32,
    as under autocast). With ``residual_in_fp32=True`` and a float16/bfloat16
    ``x``, ``s`` is returned in float32 so the residual stream keeps full
    precision across layers (pass it on as the next call's ``residual``), and
    ``y`` stays in the dtype of ``x``.
    """
    return _add_norm(x, residual, normalized_shape, weight, bias, eps, residual_in_fp32, impl, rms=False)


def add_rms_norm(
    x: Tensor,
    residual: Tensor,
    normalized_shape: ShapeLike,
    weight: Tensor | None = None,
    eps: float | None = None,
    *,
    residual_in_fp32: bool = False,
    impl: str = "auto",
) -> tuple[Tensor, Tensor]:
    """``s = x + residual``; ``y = rms_norm(s)``. Returns ``(y, s)``; see :func:`add_layer_norm`."""
    return _add_norm(x, residual, normalized_shape, weight, None, eps, residual_in_fp32, impl, rms=True)
