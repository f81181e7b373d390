"""The four ops behind one calling convention, with torch's eager baseline for each.

Shared by the numerics tests, so every contract check runs on every op and impl.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from conftest import skip_unsupported
from normlab import functional as F

OPS = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"]


def has_bias(op: str) -> bool:
    return "layer" in op


def is_add(op: str) -> bool:
    return op.startswith("add_")


def ours(op, x, w, b, *, impl="auto", r=None, eps=None):
    """Output ``y`` of normlab's ``op`` (for the add ops, ``r`` is the residual)."""
    skip_unsupported(impl, op, x, eps)
    shape = w.shape if w is not None else x.shape[-1:]
    kw = {} if eps is None else {"eps": eps}
    if op == "layer_norm":
        return F.layer_norm(x, shape, w, b, impl=impl, **kw)
    if op == "rms_norm":
        return F.rms_norm(x, shape, w, impl=impl, **kw)
    if op == "add_layer_norm":
        return F.add_layer_norm(x, r, shape, w, b, impl=impl, **kw)[0]
    return F.add_rms_norm(x, r, shape, w, impl=impl, **kw)[0]


def torchs(op, x, w, b, *, r=None, eps=None):
    """torch's eager equivalent of ``op``, in the input's dtype."""
    shape = list(w.shape if w is not None else x.shape[-1:])
    s = x + r if is_add(op) else x
    if has_bias(op):
        return TF.layer_norm(s, shape, w, b, 1e-5 if eps is None else eps)
    return TF.rms_norm(s, shape, w, eps)


def make_inputs(op, n, d, dtype, *, scale=1.0, shift=0.0, seed=0):
    """Leaf tensors ``x, w, b, r`` (``b``/``r`` None where the op has none)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d, generator=g, dtype=torch.float64) * scale + shift).to(dtype).requires_grad_()
    w = (1 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(d, generator=g, dtype=torch.float64)).to(dtype).requires_grad_() if has_bias(op) else None
    r = (torch.randn(n, d, generator=g, dtype=torch.float64)).to(dtype).requires_grad_() if is_add(op) else None
    return x, w, b, r


def grads(y, dy, tensors):
    """Gradients of ``(y * dy).sum()`` w.r.t. the non-None ``tensors``."""
    leaves = [t for t in tensors if t is not None]
    return torch.autograd.grad(y, leaves, dy)
