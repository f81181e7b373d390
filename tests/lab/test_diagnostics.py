"""Per-layer diagnostics rows."""
import pytest
import torch

import normlab
from normlab.lab.diagnostics import diagnose


def test_rows_have_every_statistic():
    torch.manual_seed(0)
    m = normlab.TransformerEncoder(16, 2, 4, 32, placement="pre", init="xavier")
    x = torch.randn(3, 6, 16)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[2, 4:] = True
    rows = diagnose(m, x, mask)
    assert [r["layer"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        for k in ("resid_norm", "token_mean", "token_std", "branch_ratio_attn", "branch_ratio_ffn", "cos_prev",
                  "grad_attn", "grad_ffn", "grad_norm", "grad_ffn_w2"):
            assert r[k] is not None and r[k] == r[k], k
    modules = list(m.modules())
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in modules)  # hooks removed


def test_pre_ln_grows_and_post_ln_does_not():
    """Direction of Xiong et al.'s Lemma 2 at a small size: Pre-LN's residual stream grows with depth."""
    torch.manual_seed(0)
    x = torch.randn(8, 16, 32)
    pre = diagnose(normlab.TransformerEncoder(32, 4, 8, 32, placement="pre", pos="none", init="xavier"), x,
                   backward=False)
    post = diagnose(normlab.TransformerEncoder(32, 4, 8, 32, placement="post", pos="none", init="xavier"), x,
                    backward=False)
    assert pre[-1]["resid_norm2_per_d"] > 3 * pre[0]["resid_norm2_per_d"]
    assert post[-1]["resid_norm2_per_d"] == pytest.approx(1.0, abs=0.05)
    assert "grad_attn" not in pre[0]


@pytest.mark.parametrize("placement, norm", [("pre", "layernorm"), ("post", "layernorm"), ("post", "batchnorm")])
def test_branch_ratio_is_what_the_unit_adds(placement, norm):
    """The hooks see the unit's own ``x`` and ``F``: recomputed by hand for layer 0's FFN unit (a post-norm that
    cannot take ``residual``, batchnorm's, had no ratio: only its sum was seen)."""
    torch.manual_seed(0)
    m = normlab.TransformerEncoder(16, 2, 2, 32, placement=placement, pos="none", norm=norm).eval()
    x = torch.randn(3, 6, 16)
    rows = diagnose(m, x, backward=False)
    attn, ffn = m.layers[0].attn, m.layers[0].ffn
    with torch.no_grad():
        s = x + attn.fn(attn.pre_norm(x)) if placement == "pre" else attn.post_norm(x + attn.fn(x))
        f = ffn.fn(ffn.pre_norm(s)) if placement == "pre" else ffn.fn(s)
    want = (f.var() / (s + f).var()).item()
    assert rows[0]["branch_ratio_ffn"] == pytest.approx(want, rel=1e-4)


def test_needs_layers():
    with pytest.raises(ValueError, match="layers"):
        diagnose(torch.nn.Linear(2, 2), torch.randn(1, 2))


def test_the_default_loss_gives_every_layer_a_gradient():
    """The mean of squares after a final norm with unit gain is constant up to eps: its gradients were 1e-6 to
    1e-8 and their ratio across layers meaningless."""
    torch.manual_seed(0)
    model = normlab.TransformerEncoder(16, 2, 3, 32, placement="pre")
    rows = diagnose(model, torch.randn(2, 6, 16))
    assert min(r["grad_ffn_w2"] for r in rows) > 1e-3


def test_a_hook_that_does_not_fire_is_an_error_not_a_missing_figure():
    """Blocks compiled before diagnose added its hooks never ran the ones inside them: the branch ratios of
    every layer but the first were silently missing."""
    torch.manual_seed(0)
    model = normlab.TransformerEncoder(8, 2, 2, 16)
    normlab.models.compile_blocks(model, backend="eager")
    model(torch.randn(2, 5, 8))  # compiled without diagnose's hooks
    with pytest.raises(ValueError, match="diagnose's hooks did not fire .*diagnose before compile_blocks"):
        diagnose(model, torch.randn(2, 5, 8))


def test_a_mask_that_does_not_fit_the_streams_is_one_clear_error():
    from normlab.models.video import VideoEncoder

    model = VideoEncoder(8, 2, 1, 16, n_patches=3)
    mask = torch.zeros(2, 4, dtype=torch.bool)
    mask[1, 3] = True
    model(torch.randn(2, 4, 3, 8), mask)  # the model takes the frame mask
    with pytest.raises(ValueError, match=r"key_padding_mask \[2, 4\] does not fit a stream of"):
        diagnose(model, torch.randn(2, 4, 3, 8), mask)


@pytest.mark.parametrize("backward", [False, True])
def test_diagnose_leaves_the_callers_gradients_as_they_were(backward):
    """diagnose zeroed every .grad (set to None) even for one forward, and with backward replaced them with its
    probe loss's: a training loop that diagnosed between backward and step lost its step."""
    torch.manual_seed(0)
    m = normlab.TransformerEncoder(16, 4, 2, 32)
    x = torch.randn(2, 5, 16)
    m(x).square().sum().backward()
    before = {n: p.grad.clone() for n, p in m.named_parameters()}
    rows = diagnose(m, x, backward=backward)
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.equal(p.grad, before[n]), n
    assert ("grad_ffn_w2" in rows[0]) == backward
    if backward:  # the probe's gradients are still what the rows report: those of a fresh backward
        fresh = normlab.TransformerEncoder(16, 4, 2, 32)
        fresh.load_state_dict(m.state_dict())
        from normlab.lab.diagnostics import _probe_loss

        _probe_loss(fresh(x)).backward()
        assert rows[1]["grad_ffn_w2"] == pytest.approx(fresh.layers[1].ffn.fn.fc2.weight.grad.norm().item(), rel=1e-6)
