"""Property tests (hypothesis): normalization and the invariances of Ba et al. 2016, Table 1.

Every property runs on every implementation (``impl`` parametrized, not only
``auto``), at eps = 0 where the implementation supports it and otherwise at the
smallest positive normal float64 (native LayerNorm refuses eps = 0), which
changes nothing for rows of std >= 1e-3.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from normlab import functional as F
from normlab import kernels

SETTINGS = settings(max_examples=60, deadline=None)
IMPLS = [n for n in kernels.IMPLS if n != "auto"] + ["auto"]
every_impl = pytest.mark.parametrize("impl", IMPLS)


def _eps(impl: str, op: str, x: torch.Tensor) -> float:
    """0.0, or the tiniest eps the impl accepts; skips an impl that cannot run ``op`` on ``x`` at all."""
    for eps in (0.0, torch.finfo(torch.float64).tiny):
        if impl == "auto" or kernels.get_kernel(impl).supports(op, x, eps):
            return eps
    pytest.skip(f"{impl} does not implement {op} for {x.dtype}")


def ln(x, d, impl):
    return F.layer_norm(x, d, eps=_eps(impl, "layer_norm", x), impl=impl)


def rms(x, d, impl):
    return F.rms_norm(x, d, eps=_eps(impl, "rms_norm", x), impl=impl)


def _rows(seed: int, n: int, d: int, scale: float, shift: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * scale + shift


rows = st.builds(
    _rows,
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 6),
    d=st.integers(2, 64),
    scale=st.floats(1e-3, 1e3),
    shift=st.floats(-1e3, 1e3),
)


@every_impl
@SETTINGS
@given(x=rows)
@example(x=_rows(seed=2, n=4, d=2, scale=0.001, shift=256.0))  # |x|/std ~ 5e6: found by hypothesis
def test_layer_norm_gives_mean_zero_variance_one_at_eps_zero(x, impl):
    """Exact up to float64 rounding, which a row's conditioning |x|/std amplifies (two-pass statistics keep it
    linear: E[x^2] - E[x]^2 would square it and fail here by orders of magnitude)."""
    d = x.shape[-1]
    y = ln(x, d, impl)
    cond = x.abs().amax(-1) / x.std(-1, unbiased=False)  # per row
    tol = 1e-9 + 8 * d * torch.finfo(torch.float64).eps * cond
    assert (y.mean(-1).abs() < tol).all()
    assert ((y.var(-1, unbiased=False) - 1).abs() < tol).all()


@every_impl
@SETTINGS
@given(x=rows)
def test_rms_norm_gives_unit_rms_at_eps_zero(x, impl):
    y = rms(x, x.shape[-1], impl)
    assert (y.pow(2).mean(-1) - 1).abs().max() < 1e-9


@every_impl
@SETTINGS
@given(x=rows, a=st.floats(1e-2, 1e2), c=st.floats(-1e2, 1e2))
def test_layer_norm_invariant_to_per_example_scale_and_shift(x, a, c, impl):
    torch.testing.assert_close(ln(a * x + c, x.shape[-1], impl), ln(x, x.shape[-1], impl))


@every_impl
@SETTINGS
@given(x=rows, a=st.floats(1e-2, 1e2))
def test_rms_norm_scale_invariant(x, a, impl):
    torch.testing.assert_close(rms(a * x, x.shape[-1], impl), rms(x, x.shape[-1], impl))


@every_impl
@SETTINGS
@given(x=rows, c=st.floats(0.5, 1e2))
def test_rms_norm_not_shift_invariant(x, c, impl):
    d = x.shape[-1]
    x = x - x.mean(-1, keepdim=True)  # centred rows: a shift must change the RMS-normalized output
    shift = c * x.std(-1, unbiased=False, keepdim=True)  # by c row-stds, so the change is O(1)
    diff = (rms(x + shift, d, impl) - rms(x, d, impl)).abs().max()
    assert diff > 0.1


@every_impl
@SETTINGS
@given(x=rows, a=st.floats(1e-2, 1e2), seed=st.integers(0, 1000))
def test_layer_norm_weight_matrix_rescaling_and_recentering(x, a, seed, impl):
    """h = x W: LN(h) is unchanged by W -> a W and by W -> W + v 1^T (the same vector added to every unit)."""
    g = torch.Generator().manual_seed(seed)
    d = x.shape[-1]
    W = torch.randn(d, 16, generator=g, dtype=torch.float64)
    v = torch.randn(d, 1, generator=g, dtype=torch.float64)
    base = ln(x @ W, 16, impl)
    torch.testing.assert_close(ln(x @ (a * W), 16, impl), base)
    torch.testing.assert_close(ln(x @ (W + v), 16, impl), base)
    if impl == "auto" or kernels.get_kernel(impl).supports("rms_norm", x, 0.0):
        r = rms(x @ W, 16, impl)
        torch.testing.assert_close(rms(x @ (a * W), 16, impl), r)  # RMS: re-scaling only
