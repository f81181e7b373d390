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


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_branch_ratio_is_what_the_unit_adds(placement):
    """The hooks see the unit's own ``x`` and ``F``: recomputed by hand for layer 0's FFN unit."""
    torch.manual_seed(0)
    m = normlab.TransformerEncoder(16, 2, 2, 32, placement=placement, pos="none")
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
