"""Argument checks shared by the functional API and the modules.

Every public entry point validates its arguments here, so that bad input fails
with one clear message instead of broadcasting silently.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

ShapeLike = int | Sequence[int] | torch.Size


def check_choice(value, choices, what: str) -> None:
    """Raise ``ValueError("unknown <what> <value>; valid: a, b, c")`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(map(str, choices))}")


def as_shape(normalized_shape: ShapeLike) -> tuple[int, ...]:
    """Turn an int, list, tuple or ``torch.Size`` into a tuple of ints."""
    if isinstance(normalized_shape, (bool, str, bytes, float)):
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    if isinstance(normalized_shape, int):
        shape: tuple[int, ...] = (normalized_shape,)
    else:
        try:
            shape = tuple(int(d) for d in normalized_shape)
        except TypeError:
            raise TypeError(
                f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
            ) from None
    if len(shape) == 0:
        raise ValueError("normalized_shape must have at least one dimension, got ()")
    if any(d < 0 for d in shape):
        raise ValueError(f"normalized_shape must be non-negative, got {shape}")
    return shape


def check_input(x: torch.Tensor, shape: tuple[int, ...], name: str = "input") -> None:
    """Check that ``x`` is a floating tensor whose trailing dims equal ``shape``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(
            f"normalized_shape {list(shape)} does not match the trailing dimensions of "
            f"{name} with shape {list(x.shape)}"
        )


def check_param(p: torch.Tensor | None, shape: tuple[int, ...], name: str) -> None:
    """Check an optional affine parameter (``weight`` or ``bias``)."""
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if not p.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {p.dtype}")
    if tuple(p.shape) != shape:
        raise ValueError(f"{name} has shape {list(p.shape)} but normalized_shape is {list(shape)}")


def check_eps(eps: float | None, *, allow_none: bool = False) -> None:
    """``eps`` must be a finite, non-negative number (or None where allowed)."""
    if eps is None:
        if allow_none:
            return
        raise ValueError("eps must be a finite non-negative number, got None")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite non-negative number, got {eps}")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics are accumulated in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_rms_eps(dtype: torch.dtype) -> float:
    """What ``torch.nn.RMSNorm(eps=None)`` uses: machine epsilon of the accumulation dtype.

    torch's documentation says ``torch.finfo(x.dtype).eps``, but its kernels compute
    half-precision input in float32 and use ``torch.finfo(float32).eps`` (checked
    against torch 2.13): float16/bfloat16/float32 -> 1.19e-07, float64 -> 2.22e-16.
    """
    return torch.finfo(acc_dtype(dtype)).eps
