"""The numerics contract (docs/numerics.md), on every op and every implementation."""
from __future__ import annotations

import pytest
import torch

from conftest import ATOL, DTYPES, HALF, max_err, skip_unsupported
from normlab import kernels
from numerics_ops import OPS, grads, has_bias, make_inputs, ours, torchs


def _double(t):
    return None if t is None else t.detach().double().requires_grad_()


def baseline(op, x, w, b, r, impl):
    """What our error is held against: torch's eager op in the same dtype, unless our path *is*
    torch's kernel (native, or auto resolving to it): then normlab's reference in the same dtype,
    so the rule never compares torch with itself."""
    eps = 1e-5 if has_bias(op) else torch.finfo(torch.float32).eps
    if kernels.resolve(impl, op, x, eps) == "native":
        return ours(op, x, w, b, impl="reference", r=r)
    return torchs(op, x, w, b, r=r)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (4.0, 10.0)])
def test_accuracy_rule(op, dtype, scale, shift, impl):
    """Error vs float64 is at most 2x the baseline's (torch's own) error in the same dtype, plus a small atol."""
    x, w, b, r = make_inputs(op, 64, 768, dtype, scale=scale, shift=shift)
    dy = torch.randn(64, 768, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = ours(op, x, w, b, impl=impl, r=r)
    yt = baseline(op, x, w, b, r, impl)
    x64, w64, b64, r64 = map(_double, (x, w, b, r))
    y64 = torchs(op, x64, w64, b64, r=r64)
    assert y.dtype == dtype
    assert max_err(y, y64) <= 2 * max_err(yt, y64) + ATOL[dtype]
    g, gt, g64 = (grads(o, dy.to(o.dtype), ins) for o, ins in ((y, (x, w, b)), (yt, (x, w, b)), (y64, (x64, w64, b64))))
    for name, a, t, ref in zip(("dx", "dw", "db"), g, gt, g64):
        scale_ = max(1.0, ref.abs().max().item())
        assert a.dtype == dtype, name
        assert max_err(a, ref) <= 2 * max_err(t, ref) + ATOL[dtype] * scale_, name


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [33, 70])
def test_weight_gradients_include_the_last_partial_block(op, dtype, n, impl):
    """N > 32 and not a multiple of the 32-row block: dw/db (float64 reference) still sum every row."""
    x, w, b, r = make_inputs(op, n, 40, dtype, seed=n)
    dy = torch.randn(n, 40, generator=torch.Generator().manual_seed(2)).to(dtype)
    y, yt = ours(op, x, w, b, impl=impl, r=r), baseline(op, x, w, b, r, impl)
    x64, w64, b64, r64 = map(_double, (x, w, b, r))
    y64 = torchs(op, x64, w64, b64, r=r64)
    params, params64 = [t for t in (w, b) if t is not None], [t for t in (w64, b64) if t is not None]
    g, gt, g64 = grads(y, dy, params), grads(yt, dy, params), grads(y64, dy.double(), params64)
    for name, a, t, ref in zip(("dw", "db"), g, gt, g64):
        assert max_err(a, ref) <= 2 * max_err(t, ref) + ATOL[dtype] * max(1.0, ref.abs().max().item()), name


def rel_err(a, ref):
    """max |a - ref| / max(1, |ref|), elementwise: the error in units of each value's own magnitude"""
    return ((a.detach().double() - ref.detach()).abs() / ref.detach().abs().clamp_min(1.0)).max().item()


def _heavy_rows(kind, n, d, seed):
    """float64 rows with heavy tails: ``outliers`` (N(0, 1) with four entries at 1000, as activations of large
    models have), ``cauchy`` (a ratio of two normals: a few entries up to ~1e4 times the rest)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    if kind == "outliers":
        z[:, torch.randperm(d, generator=g)[:4]] = 1000.0
        return z
    return z / torch.randn(n, d, generator=g, dtype=torch.float64).abs().clamp_min(1e-4)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", ["outliers", "cauchy"])
def test_accuracy_rule_on_heavy_tailed_rows(op, kind, impl):
    """The rule on float32 rows of 4096 whose sums are dominated by a few large entries, the forward's error taken
    relative to each exact value (at least 1): such rows have outputs of 30-60, where one ulp is 2-4e-6, so the
    absolute rule would ask for less than an ulp. A row reduction that added each of its 16 accumulators 256
    times in a row read 2-5x torch's relative error here (up to 10x its absolute error)."""
    for seed in range(4):
        x64 = _heavy_rows(kind, 8, 4096, seed)
        x = x64.float().requires_grad_()
        _, w, b, r = make_inputs(op, 8, 4096, torch.float32, seed=seed)
        dy = torch.randn(8, 4096, generator=torch.Generator().manual_seed(seed + 1))
        y, yt = ours(op, x, w, b, impl=impl, r=r), baseline(op, x, w, b, r, impl)
        ins64 = tuple(map(_double, (x, w, b)))
        y64 = torchs(op, *ins64, r=_double(r))
        assert rel_err(y, y64) <= 2 * rel_err(yt, y64) + 1e-7, seed
        g, gt, g64 = (grads(o, dy.to(o.dtype), ins) for o, ins in ((y, (x, w, b)), (yt, (x, w, b)), (y64, ins64)))
        for name, a, t, ref in zip(("dx", "dw", "db"), g, gt, g64):
            assert max_err(a, ref) <= 2 * max_err(t, ref) + ATOL[torch.float32] * max(1.0, ref.abs().max().item()), \
                (name, seed)


@pytest.mark.parametrize("op", OPS)
def test_accuracy_rule_on_very_long_heavy_tailed_rows(op, impl):
    """Rows of 300,000 Cauchy draws: the C++ kernels added their chunk sums in order, 2,300 of them into each
    accumulator, and read 3.4e-6 where torch reads 1.7e-7 (20x; within the rule up to rows of about 65,536). The
    chunk sums are now added pairwise. Forward only: the gradients' sums are the same reductions."""
    d = 300_000
    x64 = _heavy_rows("cauchy", 2, d, 1)
    x = x64.float()
    _, w, b, r = make_inputs(op, 2, d, torch.float32, seed=1)
    with torch.no_grad():
        y, yt = ours(op, x, w, b, impl=impl, r=r), baseline(op, x, w, b, r, impl)
        y64 = torchs(op, *map(_double, (x, w, b)), r=_double(r))
    assert rel_err(y, y64) <= 2 * rel_err(yt, y64) + 1e-7


@pytest.mark.parametrize("op", OPS)
def test_large_mean_small_std_float32(op, impl):
    """Rows with mean 1e4 and std 1e-2: two-pass statistics stay accurate (E[x^2]-E[x]^2 would not)."""
    x, w, b, r = make_inputs(op, 32, 1024, torch.float32, scale=1e-2, shift=1e4)
    if r is not None:
        r = (r.detach() * 1e-2).requires_grad_()
    y = ours(op, x, w, b, impl=impl, r=r)
    y64 = torchs(op, *map(_double, (x, w, b)), r=_double(r))
    if not (has_bias(op) and kernels.resolve(impl, op, x, 1e-5) == "native"):
        # torch's own LayerNorm kernel is not held to the reference here: the reference corrects its rounded mean
        # (errors ~1e-6 where torch's reach 0.1-0.3), so only the bound below applies to it
        yt = baseline(op, x, w, b, r, impl)
        assert max_err(y, y64) <= 2 * max_err(yt, y64) + ATOL[torch.float32]
    if has_bias(op):
        # E[x^2] - E[x]^2 loses the variance (1e-4) entirely next to E[x^2] = 1e8 (ulp 8)
        assert max_err(y, y64) < 0.5


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("d", [7, 33, 129, 1024])
def test_rounded_mean_is_corrected(op, d, impl):
    """float32 rows with mean 1e4 and std 1e-2: the first pass's mean is rounded by 5-30% of the std, and the
    deviations' own mean corrects it, so ``y`` is within float32 rounding of the exact normalization of the same
    input (uncorrected: 0.04-0.27 off, torch's kernel as well)."""
    x, w, b, r = make_inputs(op, 32, d, torch.float32, scale=1e-2, shift=1e4, seed=d)
    if r is not None:
        r = (r.detach() * 1e-2).requires_grad_()
    if kernels.resolve(impl, op, x, 1e-5) == "native":
        pytest.skip("torch's own kernel: its mean is not corrected")
    y = ours(op, x, w, b, impl=impl, r=r)
    s = x.detach() if r is None else x.detach() + r.detach()  # float32: the input the op normalizes
    y64 = torch.nn.functional.layer_norm(s.double(), (d,), w.detach().double(), b.detach().double(), 1e-5)
    assert max_err(y, y64) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_constant_row_gives_the_bias_where_its_mean_rounds(dtype, impl):
    """4000 values of 1000: the first pass's mean (the sum times 1/4000, rounded) is an ulp off, and uncorrected
    that ulp divided by itself made y about 0.02 where the bias is exact (eps 1e-5 does not hide it); the
    deviations' mean corrects it."""
    x = torch.full((4, 4000), 1000.0, dtype=dtype)
    b = torch.linspace(-1, 1, 4000)
    y = ours("layer_norm", x, None, b.to(dtype), impl=impl)  # (skips an impl that does not run this)
    if kernels.resolve(impl, "layer_norm", x, 1e-5) == "native":
        pytest.skip("torch's own kernel: its mean is not corrected")
    assert max_err(y, b.double().expand(4, 4000)) < (1e-6 if dtype == torch.float32 else 1e-3)
    # the correction itself exact: the deviations' mean taken times the rounded 1/D was an ulp off for rows not
    # a power of two long, and at a small eps that ulp over sqrt(eps) was y (0.015 at 1e-12; 1.5e4 at 1e-30)
    cases = ((994275.8125, 1000, 1e-12), (1000.1, 4000, 1e-12), (1000.1, 4000, 1e-30), (1000.1, 4000, 1e-5))
    for value, d, eps in cases if dtype == torch.float32 else ():
        x = torch.full((3, d), value, dtype=dtype)
        b = torch.linspace(-1, 1, d)
        y = ours("layer_norm", x, None, b.to(dtype), eps=eps, impl=impl)
        assert max_err(y, b.to(dtype).double().expand(3, d)) == 0, (value, d, eps)


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("dtype, scale", [(torch.float32, 1e30), (torch.float64, 1e300)])
def test_rows_whose_squares_overflow_give_the_bias(op, dtype, scale, impl):
    """Deviations past the accumulation dtype's range: the variance is inf, rstd 0, the output the bias and the
    input's gradient 0 (docs/numerics.md). The squares' sum and the squared mean of the deviations both overflow
    there, and inf - inf (NaN) was clamped to a variance of 0: rows of about 1e33 came out."""
    x = (torch.randn(4, 512, generator=torch.Generator().manual_seed(0), dtype=dtype) * scale).requires_grad_()
    b = torch.linspace(-1, 1, 512, dtype=dtype)
    r = torch.zeros_like(x) if op == "add_layer_norm" else None
    skip_unsupported(impl, op, x)
    if kernels.resolve(impl, op, x, 1e-5) == "native":
        pytest.skip("torch's own kernel gives NaN there (docs/numerics.md)")
    y = ours(op, x, None, b, impl=impl, r=r)
    assert torch.equal(y.detach(), b.expand(4, 512))
    (dx,) = grads(y, torch.ones_like(y), (x,))
    assert torch.equal(dx, torch.zeros_like(dx))


@pytest.mark.parametrize("op", OPS)
def test_float16_near_max_gives_no_overflow(op, impl):
    x, w, b, r = make_inputs(op, 8, 4096, torch.float16, scale=2e3, shift=6e4)
    x = x.detach().clamp(max=65000).requires_grad_()
    if r is not None:
        r = torch.zeros_like(r, requires_grad=True)
    y = ours(op, x, w, b, impl=impl, r=r)
    dx = grads(y, torch.ones_like(y), (x,))[0]
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()


def _zero_row(op, n, d, dtype, row):
    """``make_inputs`` with row ``row`` of ``x`` (and of the residual) all zeros, both leaves that need grad."""
    x, w, b, r = make_inputs(op, n, d, dtype)
    x = x.detach().clone()
    x[row] = 0
    x.requires_grad_()
    if r is not None:
        r = r.detach().clone()
        r[row] = 0
        r.requires_grad_()
    return x, w, b, r


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_all_zero_row_gives_bias(op, eps, impl):
    x, w, b, r = _zero_row(op, 4, 16, torch.float32, 2)
    y = ours(op, x, w, b, impl=impl, r=r, eps=eps)
    expected = b.detach() if b is not None else torch.zeros(16)
    assert torch.equal(y[2], expected)
    dx = grads(y, torch.randn_like(y), (x,))[0]
    assert torch.isfinite(dx).all()


@pytest.mark.parametrize("op", OPS)
def test_all_zero_row_at_eps_0_has_finite_higher_derivatives(op, impl):
    """At eps = 0 a zero row's rstd is defined as 0; its 1/sqrt(0) = inf, dropped by a where(), still multiplied
    the where()'s zero gradient into NaN in second derivatives and under torch.func (RMSNorm)."""
    x, w, b, r = _zero_row(op, 3, 8, torch.float64, 1)
    g, = torch.autograd.grad(ours(op, x, w, b, impl=impl, r=r, eps=0.0).pow(3).sum(), x, create_graph=True)
    assert torch.isfinite(g).all()
    assert torch.isfinite(torch.autograd.grad(g.pow(2).sum(), x)[0]).all()
    g_func = torch.func.grad(lambda x: ours(op, x, w, b, impl=impl, r=r, eps=0.0).pow(2).sum())(x)
    assert torch.isfinite(g_func).all()


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
def test_a_subnormal_eps_counts_on_every_path(op, impl):
    """eps = 1e-40 (below float32's smallest normal number, but not 0): a constant row's gradient is 1/sqrt(eps)
    times the centred upstream gradient, as torch computes it. The reference and compiled paths, and every
    traced or ``torch.func`` call, took such an eps for 0 and gave a gradient of 0."""
    x, w, b, r = _zero_row(op, 3, 8, torch.float32, 1)
    dy = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    y = ours(op, x, w, b, impl=impl, r=r, eps=1e-40)
    ours_dx = grads(y, dy, (x,))[0][1]
    x2 = x.detach().clone().requires_grad_()
    s = x2 if r is None else x2 + r.detach()
    want = torch.autograd.grad(torch.nn.functional.layer_norm(s, (8,), w.detach(), b.detach(), 1e-40), x2, dy)[0][1]
    assert want.abs().min() > 1e18 and torch.allclose(ours_dx, want, rtol=1e-5)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_row_leaves_other_rows_exact(op, bad, impl):
    x, w, b, r = make_inputs(op, 6, 32, torch.float32)
    dy = torch.randn(6, 32)
    y0 = ours(op, x, w, b, impl=impl, r=r)
    dx0 = grads(y0, dy, (x,))[0]
    xb = x.detach().clone()
    xb[3, 5] = bad
    xb.requires_grad_()
    y1 = ours(op, xb, w, b, impl=impl, r=r)
    dx1 = grads(y1, dy, (xb,))[0]
    keep = [0, 1, 2, 4, 5]
    assert torch.equal(y0[keep], y1[keep]) and torch.equal(dx0[keep], dx1[keep])
    assert not torch.isfinite(y1[3]).all()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_a_nan_makes_its_whole_row_nan_as_torchs(op, eps, impl):
    """RMSNorm at eps = 0 read a NaN row's sum of squares as 0 (``!(m > 0)``): the row came out zeros and one
    NaN, finite numbers where torch gives NaN."""
    x, w, b, r = make_inputs(op, 4, 16, torch.float32)
    xb = x.detach().clone()
    xb[2, 5] = float("nan")
    y = ours(op, xb, w, b, impl=impl, r=r, eps=eps)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()


@pytest.mark.parametrize("op", OPS)
def test_empty_batch(op, impl):
    x, w, b, r = make_inputs(op, 0, 8, torch.float32)
    x3 = x.detach().reshape(0, 3, 8).requires_grad_()
    r3 = None if r is None else r.detach().reshape(0, 3, 8).requires_grad_()
    y = ours(op, x3, w, b, impl=impl, r=r3)
    assert y.shape == (0, 3, 8)
    g = grads(y, torch.zeros_like(y), (x3, w, b))
    assert g[0].shape == (0, 3, 8)
    assert torch.equal(g[1], torch.zeros(8))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("d", [1, 3, 3000])
def test_odd_widths_match_torch(op, d, impl):
    """Against torch's math in float64 (at D=1, torch's float32 LayerNorm has x - mean != 0 by rounding,
    times rstd = 1/sqrt(eps) ~ 316: its own dweight is off by ~1e-4 while the exact one is 0)."""
    x, w, b, r = make_inputs(op, 5, d, torch.float32, scale=2.0, shift=1.0)
    dy = torch.randn(5, d, generator=torch.Generator().manual_seed(d))
    x64, w64, b64, r64 = map(_double, (x, w, b, r))
    y, yt = ours(op, x, w, b, impl=impl, r=r), torchs(op, x64, w64, b64, r=r64)
    torch.testing.assert_close(y, yt.float(), rtol=1e-5, atol=1e-5)
    for a, t in zip(grads(y, dy, (x, w, b, r)), grads(yt, dy.double(), (x64, w64, b64, r64))):
        torch.testing.assert_close(a, t.float(), rtol=1e-4, atol=1e-4)
    if d == 1 and has_bias(op):  # one feature: x - mean = 0, so the output is bias
        assert torch.equal(y, b.detach().expand(5, 1))


@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_input_equals_contiguous(op, impl):
    x, w, b, r = make_inputs(op, 24, 16, torch.float32)
    xt = x.detach().reshape(16, 24).t()  # 24, 16 view with strides (1, 24)
    xt.requires_grad_()
    assert not xt.is_contiguous()
    y_nc = ours(op, xt, w, b, impl=impl, r=r)
    y_c = ours(op, xt.detach().contiguous(), w, b, impl=impl, r=r)
    assert torch.equal(y_nc, y_c)


def _row_result(op, x, w, b, r, dy, impl):
    """Output and dx/dr of each row (dw/db mix rows, so they are not batch-invariant by nature)."""
    y = ours(op, x, w, b, impl=impl, r=r)
    g = grads(y, dy, (x, r))
    return y.detach(), g


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_invariance(op, dtype, impl):
    """Row i alone, inside 7 rows and inside 4096 rows: bitwise the same output and input gradients."""
    x, w, b, r = make_inputs(op, 4096, 256, dtype, scale=3.0, shift=1.0)
    dy = torch.randn(4096, 256, generator=torch.Generator().manual_seed(3)).to(dtype)
    i = 5

    def sub(rows):
        xs = x.detach()[rows].requires_grad_()
        rs = None if r is None else r.detach()[rows].requires_grad_()
        return _row_result(op, xs, w, b, rs, dy[rows], impl)

    y_all, g_all = sub(slice(0, 4096))
    y_7, g_7 = sub(slice(0, 7))
    y_1, g_1 = sub(slice(i, i + 1))
    assert torch.equal(y_all[i], y_1[0]) and torch.equal(y_7[i], y_1[0])
    for a, s7, one in zip(g_all, g_7, g_1):
        assert torch.equal(a[i], one[0]) and torch.equal(s7[i], one[0])


@pytest.mark.parametrize("impl", ["cpu", "compiled"])  # the kernels held to it at any row length (docs/numerics.md)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("d,backward", [(5000, True), (1 << 20, False)])
def test_a_long_row_alone_is_summed_as_in_a_batch_with_any_thread_count(op, d, backward, impl):
    """With one row, inductor split a long row's sums across threads (the compiled backward's means past 4096
    elements, the forward's chunk sums past 2**20): a row alone, in a batch, or on 1 or 2 threads differed."""
    x, w, b, r = make_inputs(op, 2, d, torch.float32, scale=3.0, shift=1.0)
    skip_unsupported(impl, op, x)
    dy = torch.randn(2, d, generator=torch.Generator().manual_seed(3))

    def row(rows, threads):
        torch.set_num_threads(threads)
        xs = x.detach()[rows].requires_grad_(backward)
        with torch.set_grad_enabled(backward):
            y = ours(op, xs, w, b, impl=impl, r=r)
            return (y.detach(), *(grads(y, dy[rows], (xs,)) if backward else ()))

    both, alone, one_thread = row(slice(0, 2), 2), row(slice(1, 2), 2), row(slice(1, 2), 1)
    for a, one, single in zip(both, alone, one_thread):
        assert torch.equal(a[1:], one) and torch.equal(one, single)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitwise_repeatable(op, dtype, impl):
    x, w, b, r = make_inputs(op, 2048, 384, dtype)
    dy = torch.randn(2048, 384).to(dtype)
    runs = []
    for _ in range(3):
        y = ours(op, x, w, b, impl=impl, r=r)
        runs.append((y.detach(), *grads(y, dy, (x, w, b, r))))
    for other in runs[1:]:
        assert all(torch.equal(a, c) for a, c in zip(runs[0], other))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
def test_half_uses_float32_statistics(op, dtype, impl):
    """A half-precision row whose mean needs more than 8 bits: float32 stats match float64 to rounding."""
    x, w, b, r = make_inputs(op, 16, 2048, dtype, scale=1.0, shift=300.0)
    y = ours(op, x, w, b, impl=impl, r=r)
    s = (x.detach() if r is None else x.detach() + r.detach()).double()  # s is stored in the input dtype
    y64 = torchs(op.removeprefix("add_"), s, w.detach().double(), None if b is None else b.detach().double())
    ulp = {torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    # within a few output ulps of the exact result (bf16 stats would be off by O(1))
    assert max_err(y, y64) <= 4 * ulp * max(1.0, y64.abs().max().item())


# Forward-only calls (no_grad, inference_mode): no backward can follow, so a kernel may run here that could
# not give a training step's statistics (torch's half-precision LayerNorm returns them in the half dtype).
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (4.0, 10.0)])
def test_forward_only_accuracy_rule(op, dtype, scale, shift, impl):
    x, w, b, r = (None if t is None else t.detach() for t in make_inputs(op, 64, 768, dtype, scale=scale,
                                                                        shift=shift))
    y64 = torchs(op, *(None if t is None else t.double() for t in (x, w, b)), r=None if r is None else r.double())
    with torch.no_grad():
        y, yt = ours(op, x, w, b, impl=impl, r=r), baseline(op, x, w, b, r, impl)
    assert y.dtype == dtype
    assert max_err(y, y64) <= 2 * max_err(yt, y64) + ATOL[dtype]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", HALF)
def test_forward_only_half_uses_float32_statistics(op, dtype, impl):
    with torch.no_grad():
        test_half_uses_float32_statistics(op, dtype, impl)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_forward_only_batch_invariant_and_repeatable(op, dtype, impl):
    """Row i alone, inside 7 rows and inside 4096 rows, and three runs: bitwise the same output."""
    x, w, b, r = (None if t is None else t.detach() for t in make_inputs(op, 4096, 256, dtype, scale=3.0,
                                                                        shift=1.0))
    i = 5
    with torch.inference_mode():
        run = lambda rows: ours(op, x[rows], w, b, impl=impl, r=None if r is None else r[rows])  # noqa: E731
        y_all, y_7, y_1 = run(slice(0, 4096)), run(slice(0, 7)), run(slice(i, i + 1))
        assert torch.equal(y_all[i], y_1[0]) and torch.equal(y_7[i], y_1[0])
        assert all(torch.equal(run(slice(0, 4096)), y_all) for _ in range(2))


@pytest.mark.parametrize("impl", ["reference", "cpu", "compiled"])
@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("dtype", HALF)
def test_the_add_ops_input_gradient_is_rounded_once(dtype, op, create_graph, impl):
    """dx = norm'(s)^T dy + ds is one output, rounded once to its dtype: the reference (and every impl under
    create_graph=True) rounded the norm's part to bfloat16 first, then added ds and rounded again: 128-260
    relative ulps off where the two nearly cancel, against half an ulp for the C++ kernel."""
    from normlab import functional as F

    skip_unsupported(impl, op, torch.zeros(1, 8, dtype=dtype))
    g = torch.Generator().manual_seed(0)
    n, d = 64, 256
    x, r, dy, ds = (torch.randn(n, d, generator=g).to(dtype) for _ in range(4))
    w = torch.randn(d, generator=g).to(dtype)
    s64 = (x + r).double().requires_grad_()  # s is x + r rounded once: the exact gradient from there
    if op == "add_layer_norm":
        y64 = torch.nn.functional.layer_norm(s64, (d,), w.double(), None, 1e-5)
    else:
        y64 = torch.nn.functional.rms_norm(s64, (d,), w.double(), torch.finfo(torch.float32).eps)
    exact, = torch.autograd.grad((y64, s64), s64, (dy.double(), ds.double()))
    xx = x.clone().requires_grad_()
    y, s = getattr(F, op)(xx, r, d, w, impl=impl)
    got, = torch.autograd.grad((y, s), xx, (dy, ds), create_graph=create_graph)
    ulps = (got.double() - exact).abs() / (torch.finfo(dtype).eps * exact.abs().clamp(min=1e-3))
    assert ulps.max().item() <= 0.55, (ulps.max().item(), impl)


def test_a_compiled_row_alone_runs_through_the_batchs_compilation(monkeypatch, tmp_path):
    """dynamo compiles a size of 1 apart from larger sizes, and inductor's code for each (its vector width,
    chosen from the first row length each compilation met) summed a row in another order: after single rows of
    16 and 48 elements, a bfloat16 row of 64 alone came out 1 ulp from the same row in a batch (4 of 6000
    rows). A row alone now runs as two rows, through the batch's compilation."""
    from normlab.kernels import fused

    x = torch.ones(1, 4)
    skip_unsupported("compiled", "layer_norm", x)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # compiled here, not read from earlier runs
    monkeypatch.setattr(fused, "_compiled", {})
    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16
    with torch.no_grad():
        for d in (16, 48):  # the history that set the single-row compilation's vector width
            ours("layer_norm", torch.randn(1, d, generator=g).to(dt), torch.randn(d).to(dt), torch.randn(d).to(dt),
                 impl="compiled")
        n, d = 6000, 64
        x = (torch.randn(n, d, generator=g) * 2 + 0.5).to(dt)
        w, b = torch.randn(d, generator=g).to(dt), torch.randn(d, generator=g).to(dt)
        batch = ours("layer_norm", x, w, b, impl="compiled")
        alone = torch.cat([ours("layer_norm", x[i:i + 1], w, b, impl="compiled") for i in range(n)])
    assert torch.equal(batch, alone)
    sizes = [k[4][2] for k in fused._compiled if isinstance(k[4], tuple)]  # x's guarded (dtype, grad, N, D)
    assert sizes and 1 not in sizes
