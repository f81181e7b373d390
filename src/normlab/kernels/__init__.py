"""Kernel dispatch: the one place that decides which implementation runs.

``impl="auto"`` picks the fastest implementation that satisfies the numerics
contract for the op, device and dtype; ``impl="reference"`` forces the
hand-derived reference path (:mod:`normlab.reference`).
"""
from __future__ import annotations

import torch

from .base import Kernel

_KERNELS: dict[str, Kernel] = {"reference": Kernel()}

#: names accepted by ``impl=``
IMPLS: tuple[str, ...] = ("auto", *_KERNELS)


def get_kernel(name: str) -> Kernel:
    """The kernel registered under ``name`` (not ``"auto"``; see :func:`resolve`)."""
    try:
        return _KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown impl {name!r}; valid: {', '.join(IMPLS)}") from None


def resolve(impl: str, op: str, x: torch.Tensor) -> str:
    """Map ``impl`` (possibly ``"auto"``) to a registered kernel name for ``op`` on ``x``.

    ``op`` is one of ``layer_norm``, ``rms_norm``, ``add_layer_norm``, ``add_rms_norm``.
    """
    if impl != "auto":
        get_kernel(impl)
        return impl
    return "reference"
