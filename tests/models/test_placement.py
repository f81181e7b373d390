"""Registry and placement formulas, each against a hand-written one-liner."""
import math

import pytest
import torch
from torch import nn

import normlab
from normlab.models import placement as P
from normlab.nn.residual import ResidualUnit, Slots, materialize
from normlab.registry import NORMS, PLACEMENTS


def test_make_norm_names_and_unknown():
    assert set(NORMS) == {"layernorm", "rmsnorm", "scalenorm", "dyt", "batchnorm", "none"}
    assert isinstance(normlab.make_norm("layernorm", 8), normlab.LayerNorm)
    assert isinstance(normlab.make_norm("none", 8), nn.Identity)
    assert normlab.make_norm("layernorm", 8, eps=1e-12).eps == 1e-12
    with pytest.raises(ValueError, match="layernorm, rmsnorm"):
        normlab.make_norm("groupnorm", 8)
    with pytest.raises(ValueError, match="pre, post, sandwich"):
        normlab.TransformerBlock(8, 2, placement="middle")


@pytest.mark.parametrize("n", [1, 6, 12, 100])
def test_deepnorm_and_admin_constants(n):
    assert P.deepnorm_alpha(n) == pytest.approx((2 * n) ** 0.25)
    assert P.deepnorm_beta(n) == pytest.approx((8 * n) ** -0.25)
    assert P.admin_omega(n) == pytest.approx(math.sqrt((2 * n + 1) / math.log(2 * n + 1) - 1))


def test_mixln_layers():
    got = [P.layer_placement("mixln", i, 12) for i in range(12)]
    assert got == ["post"] * 3 + ["pre"] * 9
    assert [P.layer_placement("mixln", i, 3) for i in range(3)] == ["pre"] * 3  # floor(0.75) = 0


def _unit(placement, n_layers=4):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    u = ResidualUnit(_Fn(lin), 8, "layernorm", P.slots(placement, 0, n_layers))
    for p in u.parameters():
        if p.dim() == 1:
            nn.init.normal_(p)  # non-trivial gamma, beta and biases
    return u, lin


class _Fn(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, h, mask=None):
        return self.lin(h)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_residual_unit_formula(placement):
    u, F = _unit(placement)
    x = torch.randn(3, 5, 8)
    u_norm = u.pre_norm if u.pre_norm is not None else u.post_norm
    ln = lambda t: torch.nn.functional.layer_norm(t, [8], u_norm.weight, u_norm.bias)  # noqa: E731
    kind = P.layer_placement(placement, 0, 4)
    if kind == "pre":
        expected = x + F(ln(x))
    elif kind == "post":
        expected = ln(x + F(x))
    elif kind == "sandwich":
        bn = lambda t: torch.nn.functional.layer_norm(t, [8], u.branch_norm.weight, u.branch_norm.bias)  # noqa: E731
        expected = x + bn(F(ln(x)))
    elif kind == "deepnorm":
        expected = ln((2 * 4) ** 0.25 * x + F(x))
    else:
        expected = ln(math.sqrt((8 + 1) / math.log(8 + 1) - 1) * x + F(x))  # n = 2N = 8
    torch.testing.assert_close(materialize(*u(x)), expected, rtol=1e-5, atol=1e-5)


def test_mixln_first_layer_is_post():
    assert P.slots("mixln", 0, 4) == P.slots("post")
    assert P.slots("mixln", 1, 4) == P.slots("pre")


def test_slot_table_as_written():
    assert P.slots("pre") == Slots(pre=True) and P.slots("sandwich") == Slots(pre=True, branch=True)
    assert P.slots("post") == Slots(post=True)
    assert P.slots("deepnorm", 0, 6) == Slots(post=True, alpha=(2 * 6) ** 0.25)
    assert P.slots("admin", 0, 6) == Slots(post=True, alpha=math.sqrt(13 / math.log(13) - 1))


def test_plan_checks_every_argument_once_for_every_encoder():
    builds = [lambda **kw: normlab.TransformerEncoder(8, 2, **kw), lambda **kw: normlab.ConformerEncoder(8, 2, **kw),
              lambda **kw: normlab.VideoEncoder(8, 2, n_patches=2, **kw)]
    for build in builds:
        with pytest.raises(ValueError, match="n_layers"):
            build(n_layers=0)
        with pytest.raises(ValueError, match="init"):
            build(n_layers=1, init="kaiming")
        built = build(n_layers=1, norm="rmsnorm", norm_kw={"eps": 1e-3})
        assert {m.eps for m in built.modules() if isinstance(m, normlab.RMSNorm)} == {1e-3}  # norm_kw reaches all


def test_deepnorm_init_scales_value_output_ffn_only():
    torch.manual_seed(0)
    b = normlab.TransformerBlock(64, 4, 128, placement="deepnorm", n_layers=12, init="xavier")
    beta = (8 * 12) ** -0.25

    def std_ratio(m):  # empirical std / xavier-normal std
        return m.weight.std().item() / math.sqrt(2 / (m.in_features + m.out_features))

    a, f = b.attn.fn, b.ffn.fn
    for m in (a.q_proj, a.k_proj):
        assert std_ratio(m) == pytest.approx(1.0, rel=0.1)
    for m in (a.v_proj, a.out_proj, f.fc1, f.fc2):
        assert std_ratio(m) == pytest.approx(beta, rel=0.1)
    assert b.attn.alpha == pytest.approx((2 * 12) ** 0.25)


def test_final_norm_only_for_pre_style():
    for p, has in [("pre", True), ("sandwich", True), ("mixln", True), ("post", False), ("deepnorm", False),
                   ("admin", False)]:
        assert (normlab.TransformerEncoder(16, 2, 4, placement=p).final_norm is not None) == has


#: the Conformer's matrices DeepNorm scales by beta (its FFNs, value and output maps, both pointwise maps of the
#: convolution module), and those that keep their init (queries, keys, the depthwise filter), named here, not
#: read from the modules' own declarations
CONFORMER_SCALED = ["ffn1.fn.fc1", "ffn1.fn.fc2", "attn.fn.out_proj", "conv.fn.pointwise_in", "conv.fn.pointwise_out",
                    "ffn2.fn.fc1", "ffn2.fn.fc2"]
CONFORMER_KEPT = ["conv.fn.depthwise"]


@pytest.mark.parametrize("built", ["encoder", "block"])
def test_deepnorm_scales_the_conformer_matrices_named_by_hand(built):
    n, d = 6, 16
    beta = (8 * n) ** -0.25

    def blocks(placement):
        torch.manual_seed(0)
        if built == "encoder":
            return list(normlab.ConformerEncoder(d, 2, n, 32, kernel_size=3, placement=placement).layers)
        return [normlab.ConformerBlock(d, 2, 32, kernel_size=3, placement=placement, n_layers=n)]

    get = lambda block, name: block.get_submodule(name).weight.detach()  # noqa: E731
    for deep, plain in zip(blocks("deepnorm"), blocks("post")):
        for name in CONFORMER_SCALED:
            assert torch.equal(get(deep, name), get(plain, name) * beta), name
        for name in CONFORMER_KEPT:
            assert torch.equal(get(deep, name), get(plain, name)), name
        qkv, qkv_plain = get(deep, "attn.fn.qkv_proj"), get(plain, "attn.fn.qkv_proj")
        assert torch.equal(qkv[:2 * d], qkv_plain[:2 * d]) and torch.equal(qkv[2 * d:], qkv_plain[2 * d:] * beta)
