"""Kernel dispatch: the one place that decides which implementation runs.

Implementations (``impl=``):

* ``"reference"``: the hand-derived teaching code (:mod:`normlab.reference`);
  always available, the definition every other path is tested against.
* ``"native"``: torch's own fused LayerNorm kernel, float32 and float64 only
  (its half-precision CPU path keeps half-precision statistics); for
  ``add_layer_norm`` the eager add followed by that kernel.
* ``"compiled"``: normlab's fused math (:mod:`normlab.kernels.fused`) compiled
  by inductor; every op and dtype, where a compiler is available.
* ``"auto"``: the fastest implementation that satisfies the numerics contract
  for the op, device and dtype, measured in ``docs/performance.md``:
  LayerNorm and add+LayerNorm in float32/float64 -> native; everything else
  -> compiled; reference where neither applies.
"""
from __future__ import annotations

import contextlib

import torch

from .base import Kernel
from .fused import CompiledKernel
from .native import NativeKernel

_KERNELS: dict[str, Kernel] = {k.name: k for k in (Kernel(), NativeKernel(), CompiledKernel())}

#: names accepted by ``impl=``
IMPLS: tuple[str, ...] = ("auto", *_KERNELS)

#: the order ``auto`` tries, per op
_PREFERENCE = {
    "layer_norm": ("native", "compiled", "reference"),
    "rms_norm": ("compiled", "reference"),
    # float32: the compiled kernel measured 0.94-1.06x of eager add + torch's LayerNorm (whose backward
    # is hand-tuned C++); that composition is the faster path. Half precision: compiled (1.0-1.4x).
    "add_layer_norm": ("native", "compiled", "reference"),
    "add_rms_norm": ("compiled", "reference"),
}


_compiled_enabled = [True]


def enable_compiled(enabled: bool = True) -> None:
    """Let ``auto`` pick the compiled kernels (default) or not.

    Compiled calls cost ~70 µs each in guards and wrapper code; for tiny
    tensors (the studies' d=64 models) the eager paths are faster, and worker
    processes then skip the compile cold start.
    """
    _compiled_enabled[0] = bool(enabled)


@contextlib.contextmanager
def use_compiled(enabled: bool):
    """``with use_compiled(False): ...``: :func:`enable_compiled` for a block, restored after."""
    before = _compiled_enabled[0]
    enable_compiled(enabled)
    try:
        yield
    finally:
        enable_compiled(before)


def get_kernel(name: str) -> Kernel:
    """The kernel registered under ``name`` (not ``"auto"``; see :func:`resolve`)."""
    try:
        return _KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown impl {name!r}; valid: {', '.join(IMPLS)}") from None


def resolve(impl: str, op: str, x: torch.Tensor, eps: float) -> str:
    """Map ``impl`` (possibly ``"auto"``) to a kernel name that runs ``op`` on ``x``.

    ``op`` is one of ``layer_norm``, ``rms_norm``, ``add_layer_norm``, ``add_rms_norm``.
    A forced ``impl`` that cannot run ``op`` on ``x`` raises ValueError.
    """
    if impl != "auto":
        if not get_kernel(impl).supports(op, x, eps):
            raise ValueError(f"impl {impl!r} does not support {op} for {x.dtype} on {x.device.type} with eps={eps}")
        return impl
    for name in _PREFERENCE[op]:
        if name == "compiled" and not _compiled_enabled[0]:
            continue
        if _KERNELS[name].supports(op, x, eps):
            return name
    return "reference"
