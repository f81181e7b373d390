"""Property tests (hypothesis): normalization and the invariances of Ba et al. 2016, Table 1."""
from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from normlab import functional as F

SETTINGS = settings(max_examples=60, deadline=None)


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


@SETTINGS
@given(x=rows)
@example(x=_rows(seed=2, n=4, d=2, scale=0.001, shift=256.0))  # |x|/std ~ 5e6: found by hypothesis
def test_layer_norm_gives_mean_zero_variance_one_at_eps_zero(x):
    """Exact up to float64 rounding, which a row's conditioning |x|/std amplifies (two-pass statistics keep it
    linear: E[x^2] - E[x]^2 would square it and fail here by orders of magnitude)."""
    d = x.shape[-1]
    y = F.layer_norm(x, d, eps=0.0)
    cond = x.abs().amax(-1) / x.std(-1, unbiased=False)  # per row
    tol = 1e-9 + 8 * d * torch.finfo(torch.float64).eps * cond
    assert (y.mean(-1).abs() < tol).all()
    assert ((y.var(-1, unbiased=False) - 1).abs() < tol).all()


@SETTINGS
@given(x=rows)
def test_rms_norm_gives_unit_rms_at_eps_zero(x):
    y = F.rms_norm(x, x.shape[-1], eps=0.0)
    assert (y.pow(2).mean(-1) - 1).abs().max() < 1e-9


@SETTINGS
@given(x=rows, a=st.floats(1e-2, 1e2), c=st.floats(-1e2, 1e2))
def test_layer_norm_invariant_to_per_example_scale_and_shift(x, a, c):
    torch.testing.assert_close(F.layer_norm(a * x + c, x.shape[-1], eps=0.0), F.layer_norm(x, x.shape[-1], eps=0.0))


@SETTINGS
@given(x=rows, a=st.floats(1e-2, 1e2))
def test_rms_norm_scale_invariant(x, a):
    torch.testing.assert_close(F.rms_norm(a * x, x.shape[-1], eps=0.0), F.rms_norm(x, x.shape[-1], eps=0.0))


@SETTINGS
@given(x=rows, c=st.floats(0.5, 1e2))
def test_rms_norm_not_shift_invariant(x, c):
    d = x.shape[-1]
    x = x - x.mean(-1, keepdim=True)  # centred rows: a shift must change the RMS-normalized output
    shift = c * x.std(-1, unbiased=False, keepdim=True)  # by c row-stds, so the change is O(1)
    diff = (F.rms_norm(x + shift, d, eps=0.0) - F.rms_norm(x, d, eps=0.0)).abs().max()
    assert diff > 0.1


@SETTINGS
@given(x=rows, a=st.floats(1e-2, 1e2), seed=st.integers(0, 1000))
def test_layer_norm_weight_matrix_rescaling_and_recentering(x, a, seed):
    """h = x W: LN(h) is unchanged by W -> a W and by W -> W + v 1^T (the same vector added to every unit)."""
    g = torch.Generator().manual_seed(seed)
    d = x.shape[-1]
    W = torch.randn(d, 16, generator=g, dtype=torch.float64)
    v = torch.randn(d, 1, generator=g, dtype=torch.float64)
    base = F.layer_norm(x @ W, 16, eps=0.0)
    torch.testing.assert_close(F.layer_norm(x @ (a * W), 16, eps=0.0), base)
    torch.testing.assert_close(F.layer_norm(x @ (W + v), 16, eps=0.0), base)
    rms = F.rms_norm(x @ W, 16, eps=0.0)
    torch.testing.assert_close(F.rms_norm(x @ (a * W), 16, eps=0.0), rms)  # RMS: re-scaling only
