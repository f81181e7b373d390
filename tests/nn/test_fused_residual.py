"""The pending residual add goes to any norm whose forward takes ``residual=``, whatever its class."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
from normlab import functional as F
from normlab.nn.residual import materialize, takes_residual
from normlab.registry import NORMS

D, H = 16, 2


class SubLayerNorm(normlab.LayerNorm):
    """A user's LayerNorm: same forward, another class."""


class SubRMSNorm(normlab.RMSNorm):
    pass


def _count(monkeypatch, name: str) -> list:
    calls = []
    op = getattr(F, name)
    monkeypatch.setattr(F, name, lambda *a, **kw: calls.append(1) or op(*a, **kw))
    return calls


@pytest.mark.parametrize("norm, sub, kernel", [("layernorm", SubLayerNorm, "add_layer_norm"),
                                               ("rmsnorm", SubRMSNorm, "add_rms_norm")])
def test_a_subclass_keeps_the_fused_path_and_the_bits(norm, sub, kernel, monkeypatch):
    torch.manual_seed(0)
    plain = normlab.TransformerEncoder(D, H, 2, 32, norm=norm, placement="pre")
    monkeypatch.setitem(NORMS, norm, sub)
    torch.manual_seed(0)
    mine = normlab.TransformerEncoder(D, H, 2, 32, norm=norm, placement="pre")
    assert {type(m) for m in mine.modules() if isinstance(m, normlab.LayerNorm | normlab.RMSNorm)} == {sub}
    calls = _count(monkeypatch, kernel)
    x = torch.randn(2, 5, D)
    y = mine(x)
    assert len(calls) == 4  # 2 layers x 2 units: 3 junctions after the first pre-norm, and the final norm
    assert torch.equal(y, plain(x))


def test_a_norm_without_residual_gets_the_sum(monkeypatch):
    """torch's own LayerNorm cannot take ``residual``: the unit adds, then calls it; hooks still fire."""
    torch.manual_seed(0)
    ours = normlab.TransformerEncoder(D, H, 2, 32, placement="pre")
    monkeypatch.setitem(NORMS, "layernorm", lambda dim, **kw: nn.LayerNorm(dim, **kw))
    torch.manual_seed(0)
    theirs = normlab.TransformerEncoder(D, H, 2, 32, placement="pre")
    assert not takes_residual(theirs.final_norm) and takes_residual(ours.final_norm)
    calls = _count(monkeypatch, "add_layer_norm")
    seen = []
    for m in theirs.modules():
        if isinstance(m, nn.LayerNorm):
            m.register_forward_hook(lambda m, a, o: seen.append(m))
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(theirs(x), ours(x), rtol=1e-5, atol=1e-5)
    assert len(seen) == 5 and len(calls) == 4  # the 4 fused calls are ours; theirs added unfused


def test_norms_take_residual_and_return_norm_and_sum():
    torch.manual_seed(0)
    x, r = torch.randn(3, 4, D) * 3, torch.randn(3, 4, D)
    for cls in (normlab.LayerNorm, normlab.RMSNorm, normlab.ScaleNorm, normlab.DyT):
        norm = cls(D)
        y, s = norm(x, residual=r)
        assert torch.equal(s, x + r), cls.__name__
        torch.testing.assert_close(y, norm(x + r), rtol=1e-6, atol=1e-6)
        assert isinstance(norm(x), torch.Tensor)  # without residual: a drop-in, one tensor out


def test_carry_helpers():
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    assert materialize(a, None) is a and materialize(None, b) is b and torch.equal(materialize(a, b), a + b)


@pytest.mark.parametrize("norm,placement,hooked", [("layernorm", "pre", False), ("layernorm", "pre", True),
                                                   ("scalenorm", "pre", False), ("dyt", "pre", False),
                                                   ("layernorm", "post", False)])
def test_a_pending_residual_of_another_shape_is_refused_on_every_path(norm, placement, hooked):
    """Only the fused LayerNorm/RMSNorm kernel refused a residual of another shape: a norm without one, post
    placement, or the same block once a hook watched its norm, broadcast a one-row residual to every row."""
    block = normlab.TransformerBlock(16, 4, norm=norm, placement=placement).eval()
    if hooked:
        block.attn.pre_norm.register_forward_hook(lambda *a: None)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"residual has shape \[1, 5, 16\] but x has shape \[2, 5, 16\]"):
        materialize(*block(x, torch.randn(1, 5, 16)))
    assert materialize(*block(x, torch.randn(2, 5, 16))).shape == x.shape
