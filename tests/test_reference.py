"""The teaching implementation against autograd and the formula in float64."""
import pytest
import torch

from normlab import reference


def _autograd_ln(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def _autograd_rms(x, w, eps):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def _leaf(*shape, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale + shift).requires_grad_()


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 16), (1, 1)])
def test_layer_norm_backward_matches_autograd(affine, shape):
    torch.manual_seed(0)
    D = shape[-1]
    x = _leaf(*shape, scale=3.0, shift=2.0)
    w = _leaf(D) if affine[0] else None
    b = _leaf(D) if affine[1] else None
    dy = torch.randn(*shape, dtype=torch.float64)  # random upstream gradient
    y, cache = reference.layer_norm_forward(x.detach(), None if w is None else w.detach(),
                                            None if b is None else b.detach(), 1e-5)
    y_auto = _autograd_ln(x, w, b, 1e-5)
    torch.testing.assert_close(y, y_auto.detach(), rtol=1e-12, atol=1e-12)
    dx, dw, db = reference.layer_norm_backward(dy, cache)
    grads = torch.autograd.grad(y_auto, [t for t in (x, w, b) if t is not None], dy)
    torch.testing.assert_close(dx, grads[0], rtol=1e-10, atol=1e-10)
    i = 1
    if w is not None:
        torch.testing.assert_close(dw, grads[i], rtol=1e-10, atol=1e-10)
        i += 1
    else:
        assert dw is None
    if b is not None:
        torch.testing.assert_close(db, grads[i], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_backward_matches_autograd(with_weight):
    torch.manual_seed(1)
    x = _leaf(4, 6, 32, scale=2.0, shift=0.5)
    w = _leaf(32) if with_weight else None
    dy = torch.randn(4, 6, 32, dtype=torch.float64)
    y, cache = reference.rms_norm_forward(x.detach(), None if w is None else w.detach(), 1e-6)
    y_auto = _autograd_rms(x, w, 1e-6)
    torch.testing.assert_close(y, y_auto.detach(), rtol=1e-12, atol=1e-12)
    dx, dw = reference.rms_norm_backward(dy, cache)
    grads = torch.autograd.grad(y_auto, [t for t in (x, w) if t is not None], dy)
    torch.testing.assert_close(dx, grads[0], rtol=1e-10, atol=1e-10)
    if with_weight:
        torch.testing.assert_close(dw, grads[1], rtol=1e-10, atol=1e-10)
    else:
        assert dw is None


def test_cache_holds_only_input_and_row_stats():
    x = torch.randn(8, 16)
    w, b = torch.ones(16), torch.zeros(16)
    _, cache = reference.layer_norm_forward(x, w, b, 1e-5)
    assert cache.x is x
    assert cache.mean.shape == (8, 1) and cache.rstd.shape == (8, 1)
    assert cache.mean.dtype == torch.float32
    _, cache = reference.rms_norm_forward(x.half(), w, 1e-5)
    assert cache.mean is None and cache.rstd.shape == (8, 1) and cache.rstd.dtype == torch.float32


def test_half_input_statistics_in_float32():
    x = (torch.randn(4, 64) * 3 + 100).to(torch.bfloat16)
    _, cache = reference.layer_norm_forward(x, None, None, 1e-5)
    exact = x.double().mean(-1, keepdim=True)
    assert cache.mean.dtype == torch.float32
    # a bfloat16 mean would be off by up to half an ulp at 100 (0.25); float32 is exact to ~1e-5
    assert (cache.mean.double() - exact).abs().max() < 1e-4


def test_zero_variance_with_eps_zero_gives_bias():
    x = torch.full((3, 5), 2.5)
    b = torch.arange(5.0)
    y, cache = reference.layer_norm_forward(x, torch.ones(5), b, 0.0)
    torch.testing.assert_close(y, b.expand(3, 5))
    dx, _, _ = reference.layer_norm_backward(torch.randn(3, 5), cache)
    assert torch.isfinite(dx).all()


@pytest.mark.parametrize("rms", [False, True])
def test_one_row_of_shape_d_gets_weight_and_bias_gradients_of_shape_d(rms):
    """``sum(dim=())`` sums every element: for one row ``(D,)`` the weight and bias gradients came back as
    scalars (the module docstring promises ``[..., D]``)."""
    g = torch.Generator().manual_seed(0)
    x, w, b, dy = (torch.randn(6, dtype=torch.float64, generator=g) for _ in range(4))
    xr = x.clone().requires_grad_()
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    if rms:
        _, cache = reference.rms_norm_forward(x, w, 1e-6)
        dx, dw = reference.rms_norm_backward(dy, cache)
        torch.autograd.backward(torch.nn.functional.rms_norm(xr, (6,), wr, 1e-6), dy)
        grads = [(dx, xr.grad), (dw, wr.grad)]
    else:
        _, cache = reference.layer_norm_forward(x, w, b, 1e-5)
        dx, dw, db = reference.layer_norm_backward(dy, cache)
        torch.autograd.backward(torch.nn.functional.layer_norm(xr, (6,), wr, br, 1e-5), dy)
        grads = [(dx, xr.grad), (dw, wr.grad), (db, br.grad)]
    for ours, theirs in grads:
        assert ours.shape == (6,)
        torch.testing.assert_close(ours, theirs)
