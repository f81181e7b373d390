"""Modules: torch's anatomy, state_dict interchange, RMSNorm's eps, ScaleNorm and DyT."""
from __future__ import annotations

import inspect
import math

import pytest
import torch
from torch import nn

import normlab

PAIRS = [(normlab.LayerNorm, nn.LayerNorm), (normlab.RMSNorm, nn.RMSNorm)]


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_constructor_signature_matches_torch(ours, theirs):
    a, b = inspect.signature(ours.__init__).parameters, inspect.signature(theirs.__init__).parameters
    assert list(a) == list(b)
    assert [p.default for p in a.values()] == [p.default for p in b.values()]


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_forward_takes_its_input_by_torch_s_name(ours, theirs):
    """``LayerNorm(8)(input=x)`` and ``F.layer_norm(input=x, ...)``, as torch names them, were a TypeError."""
    first = lambda f: next(iter(inspect.signature(f).parameters))  # noqa: E731
    name = first(theirs(8).forward)  # input (LayerNorm), x (RMSNorm)
    assert first(ours(8).forward) == name
    x = torch.randn(3, 8)
    assert torch.equal(ours(8)(**{name: x}), ours(8)(x))
    fn = {normlab.LayerNorm: "layer_norm", normlab.RMSNorm: "rms_norm"}[ours]
    ours_f, theirs_f = getattr(normlab.functional, fn), getattr(torch.nn.functional, fn)
    assert first(ours_f) == first(theirs_f) == "input"
    assert torch.equal(ours_f(input=x, normalized_shape=(8,)), ours_f(x, 8))


@pytest.mark.parametrize("ours,theirs", PAIRS)
@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"bias": False}])
def test_state_dict_both_directions(ours, theirs, kwargs):
    if "bias" in kwargs and ours is normlab.RMSNorm:
        pytest.skip("RMSNorm has no bias")
    torch.manual_seed(0)
    a, b = ours((4, 6), **kwargs), theirs((4, 6), **kwargs)
    assert list(a.state_dict()) == list(b.state_dict())
    for p in a.parameters():
        nn.init.normal_(p)
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 4, 6)
    torch.testing.assert_close(a(x), b(x))
    for p in b.parameters():
        nn.init.normal_(p)
    a.load_state_dict(b.state_dict())
    torch.testing.assert_close(a(x), b(x))


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_anatomy(ours, theirs):
    a, b = ours(8), theirs(8)
    for kw in ({}, {"elementwise_affine": False}):
        assert repr(ours(8, **kw)).split("(", 1)[1] == repr(theirs(8, **kw)).split("(", 1)[1]
    assert a.normalized_shape == b.normalized_shape == (8,)
    assert a.eps == b.eps
    a2 = ours(8, elementwise_affine=False)
    assert a2.weight is None and list(a2.state_dict()) == []
    if ours is normlab.LayerNorm:
        assert ours(8, bias=False).bias is None
    with torch.no_grad():
        a.weight.fill_(3.0)
    a.reset_parameters()
    assert torch.equal(a.weight, torch.ones(8))


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_a_numpy_integer_is_a_shape_as_torch_takes_it(ours, theirs):
    """torch.nn.LayerNorm(np.int64(8)) works (numbers.Integral); normlab refused it as not a sequence."""
    np = pytest.importorskip("numpy")
    for n in (np.int64(8), np.int32(8)):
        a, b = ours(n), theirs(n)
        assert a.normalized_shape == (8,) == tuple(b.normalized_shape)
        assert type(a.normalized_shape[0]) is int


@pytest.mark.parametrize("cls", [normlab.LayerNorm, normlab.RMSNorm, normlab.ScaleNorm, normlab.DyT])
def test_factory_kwargs(cls):
    m = cls(8, dtype=torch.float64, device="cpu")
    assert all(p.dtype == torch.float64 for p in m.parameters())
    assert m(torch.randn(2, 8, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rmsnorm_default_eps_is_what_torch_computes(dtype):
    """Tiny inputs make eps visible: finfo(float16).eps would change the output by O(1)."""
    torch.manual_seed(0)
    x = (torch.randn(8, 64, dtype=torch.float64) * 1e-3).to(dtype)
    ours, theirs = normlab.RMSNorm(64, dtype=dtype), nn.RMSNorm(64, dtype=dtype)
    # a wrong eps moves outputs by 6% (float32/64) to ~100% (half); the bounds allow rounding only
    atol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-9}[dtype]
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=atol)


@pytest.mark.parametrize("cls", [normlab.LayerNorm, normlab.RMSNorm, normlab.ScaleNorm])
@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf")])
def test_bad_eps_in_modules(cls, eps):
    with pytest.raises(ValueError, match="eps"):
        cls(8, eps=eps)
    m = cls(8)
    m.eps = eps  # set after construction: checked when it is used (ScaleNorm gave NaN rows silently)
    with pytest.raises(ValueError, match="eps"):
        m(torch.randn(2, 8) * 1e-8)


def test_module_wrong_input_shape():
    with pytest.raises(ValueError, match=r"normalized_shape \[8\]"):
        normlab.LayerNorm(8)(torch.randn(2, 7))
    with pytest.raises(TypeError):
        normlab.RMSNorm(8)(torch.ones(2, 8, dtype=torch.long))


def test_scalenorm():
    m = normlab.ScaleNorm(16)
    assert m.g.shape == () and m.g.item() == pytest.approx(4.0)  # sqrt(16)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    m = m.double()
    expected = 4.0 * x / x.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(m(x), expected)
    assert torch.equal(m(torch.zeros(2, 16, dtype=torch.float64)), torch.zeros(2, 16, dtype=torch.float64))
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(m, (xg,))
    with pytest.raises(ValueError):
        m(torch.randn(2, 15, dtype=torch.float64))


def test_dyt():
    m = normlab.DyT(8).double()
    assert m.alpha.item() == 0.5 and torch.equal(m.weight, torch.ones(8, dtype=torch.float64))
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(m(x), m.weight * torch.tanh(0.5 * x) + m.bias)
    assert torch.autograd.gradcheck(m, (x,))
    assert normlab.DyT(8, alpha_init=2.0).alpha.item() == 2.0
    assert normlab.DyT(8, elementwise_affine=False).weight is None
    with pytest.raises(ValueError):
        normlab.DyT(8, alpha_init=math.inf)


def test_modules_train_a_step():
    """Gradients reach every parameter through the hand-written backward."""
    for m in (normlab.LayerNorm(8), normlab.RMSNorm(8), normlab.ScaleNorm(8), normlab.DyT(8)):
        x = torch.randn(4, 8)
        (m(x) * torch.randn(4, 8)).sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_masked_batchnorm_in_training_refuses_fewer_than_two_valid_frames_eagerly():
    """One valid frame has no variance to estimate (the unbiased running variance would divide by 0): a clear
    error eagerly (torch.compile and torch.export skip the check: they cannot read the count)."""
    from normlab._checks import BadValue
    from normlab.registry import MaskedBatchNorm

    bn = MaskedBatchNorm(4).train()
    x = torch.randn(1, 3, 4)
    mask = torch.tensor([[False, True, True]])  # one valid frame
    with pytest.raises(BadValue, match="at least 2 valid frames"):
        bn(x, mask)
    bn(x, torch.tensor([[False, False, True]]))  # two: fine


def _batchnorm_of_valid_frames(x, mask, steps=1, momentum=0.1):
    ref = torch.nn.BatchNorm1d(x.shape[-1], momentum=momentum).double()
    for _ in range(steps):
        y = ref(x[~mask])
    return y, ref


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e300])
def test_masked_batchnorm_ignores_whatever_the_padding_holds(bad):
    """Padding was multiplied by 0, so a NaN or inf there (attention over a fully padded row gives NaN) made every
    output NaN and the running statistics NaN for good."""
    from normlab.registry import MaskedBatchNorm

    x = torch.randn(3, 5, 4, dtype=torch.float64)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 3:] = mask[2, 1:] = True
    x[mask] = bad
    bn = MaskedBatchNorm(4).double().train()
    y = bn(x, mask)
    y_ref, ref = _batchnorm_of_valid_frames(x, mask)
    torch.testing.assert_close(y[~mask], y_ref)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    # and backward: the gradients of a loss on the valid frames are finite and as torch's on those frames alone
    xg = x.clone().requires_grad_()
    bn2 = MaskedBatchNorm(4).double().train()
    (bn2(xg, mask)[~mask] ** 2).sum().backward()
    ref2 = torch.nn.BatchNorm1d(4).double()
    xv = x[~mask].clone().requires_grad_()
    (ref2(xv) ** 2).sum().backward()
    torch.testing.assert_close(bn2.weight.grad, ref2.weight.grad)
    torch.testing.assert_close(bn2.bias.grad, ref2.bias.grad)
    torch.testing.assert_close(xg.grad[~mask], xv.grad)


def test_masked_batchnorm_takes_only_a_bool_mask_of_leading_dims():
    """A uint8 mask's ``~`` is 255 or 254: padding weighed as much as a frame, silently."""
    from normlab._checks import BadType, BadValue
    from normlab.registry import MaskedBatchNorm

    bn = MaskedBatchNorm(4).train()
    x = torch.randn(2, 5, 4)
    for mask in (torch.zeros(2, 5, dtype=torch.uint8), torch.zeros(2, 5, dtype=torch.long), [[0] * 5] * 2):
        with pytest.raises(BadType, match="bool tensor"):
            bn(x, mask)
    with pytest.raises(BadValue, match="leading dims"):
        bn(x, torch.zeros(5, 2, dtype=torch.bool))
    bn(x, torch.zeros(2, dtype=torch.bool))  # a prefix: whole sequences
    bn(x, torch.zeros(2, 5, dtype=torch.bool))


def test_masked_batchnorm_momentum_none_is_a_cumulative_average():
    from normlab._checks import BadValue
    from normlab.registry import MaskedBatchNorm

    x = torch.randn(4, 6, 3, dtype=torch.float64)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[1, 2:] = True
    bn = MaskedBatchNorm(3, momentum=None).double().train()
    ref = torch.nn.BatchNorm1d(3, momentum=None).double()
    for k in range(3):
        xk = x * (k + 1) + k
        bn(xk, mask)
        ref(xk[~mask])
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    for bad in (-0.1, 1.5, "0.1"):
        with pytest.raises(BadValue, match="momentum"):
            MaskedBatchNorm(3, momentum=bad)


def test_masked_batchnorm_checks_its_mask_in_eval_as_in_training():
    """An integer or misshapen mask was refused in training and accepted silently in eval: a model that
    evaluated cleanly failed at its first training step."""
    from normlab.batchnorm import MaskedBatchNorm

    bn, x = MaskedBatchNorm(8), torch.randn(2, 3, 8)
    for mode in (bn.train, bn.eval):
        mode()
        with pytest.raises(TypeError, match="padding mask must be a bool tensor"):
            bn(x, torch.zeros(2, 3, dtype=torch.long))
        with pytest.raises(ValueError, match="padding mask has shape"):
            bn(x, torch.ones(5, dtype=torch.bool))
    assert bn(x, torch.zeros(2, 3, dtype=torch.bool)).shape == x.shape


def test_masked_batchnorm_resets_as_torchs_batchnorm_and_builds_on_meta():
    """torch's recipe for a large model: build on the meta device, ``to_empty()``, then ``reset_parameters()`` on
    every module that has it; the Conformer's convolution norm kept uninitialised memory before."""
    from normlab.batchnorm import MaskedBatchNorm

    bn, ref = MaskedBatchNorm(4).train(), nn.BatchNorm1d(4)
    bn(torch.randn(3, 5, 4))
    with torch.no_grad():
        bn.weight.mul_(3)
        bn.bias.add_(1)
    bn.reset_parameters()
    for name, t in ref.state_dict().items():
        assert torch.equal(bn.state_dict()[name], t), name
    with torch.device("meta"):
        model = normlab.ConformerEncoder(16, 2, 1)
    model.to_empty(device="cpu")
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm)]
    assert norms and all(torch.equal(m.running_var, torch.ones(16)) and int(m.num_batches_tracked) == 0
                         and torch.equal(m.weight, torch.ones(16)) for m in norms)


def test_a_norm_argument_of_the_wrong_name_or_kind_is_named():
    """norm_kw={"foo": 1} raised the constructor's TypeError ("unexpected keyword argument"), naming no norm_kw;
    DyT(alpha_init="0.5") raised math's "must be real number, not str"."""
    import normlab
    from normlab.registry import make_norm

    with pytest.raises(ValueError, match="'foo': not an argument of LayerNorm .*valid: eps, elementwise_affine, bias"):
        normlab.TransformerBlock(8, 2, norm_kw={"foo": 1})
    with pytest.raises(ValueError, match="'bias': not an argument of ScaleNorm"):
        make_norm("scalenorm", 8, bias=False)
    assert make_norm("layernorm", 8, eps=1e-6).eps == 1e-6
    with pytest.raises(TypeError, match="alpha_init must be a number, got str"):
        normlab.DyT(8, alpha_init="0.5")
    with pytest.raises(TypeError, match="^bias must be True or False, got 'no'$"):
        normlab.LayerNorm(8, bias="no")  # (torch's LayerNorm keeps a bias: "no" is true)
    with pytest.raises(TypeError, match="^elementwise_affine must be True or False, got 'False'$"):
        normlab.RMSNorm(8, elementwise_affine="False")
    assert normlab.LayerNorm(8, bias=0).bias is None and normlab.RMSNorm(8, elementwise_affine=1).weight is not None


def test_scalenorm_at_eps_zero_gives_a_zero_row_zero_and_keeps_padding_out():
    """ScaleNorm(eps=0) made a zero row 0 * inf = NaN; in an encoder a zero-padded frame's NaN reached the valid
    frames through attention (NaN times an attention weight of 0 is NaN)."""
    import normlab

    x = torch.zeros(2, 8, dtype=torch.float64, requires_grad=True)
    norm = normlab.ScaleNorm(8, eps=0.0).double()
    y = norm(x)
    assert torch.equal(y, torch.zeros_like(y))
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(norm.g.grad).all()
    torch.manual_seed(0)
    v = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(norm(v), norm.g * v / v.norm(dim=-1, keepdim=True))  # unchanged elsewhere
    torch.manual_seed(0)
    seq = torch.randn(2, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    seq[mask] = 0
    enc = normlab.TransformerEncoder(8, 2, 2, 16, norm="scalenorm", norm_kw={"eps": 0.0}, pos="none").eval()
    with torch.no_grad():
        torch.testing.assert_close(enc(seq, mask)[1, :3], enc(seq[1:, :3])[0])
