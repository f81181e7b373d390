"""The model bench's correctness check and its forced-impl switch (no timing)."""
import pytest
import torch

from normlab import functional as F
from normlab.lab import bench_model as bm

SMALL = bm.ModelBenchConfig(layers=2, d_model=32, heads=4, d_ff=64, batch=3, tokens=13, min_len=0.4)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_normlab_encoder_matches_torch_within_1e5(activation):
    ours, ref, x, pad = bm.build(bm.ModelBenchConfig(**{**SMALL.__dict__, "activation": activation}))
    assert pad.any(), "the check must cover padding"
    result = bm.check(ours, ref, x, pad)
    assert result["passed"], result
    assert max(result["train_forward"], result["inference"]) <= bm.TOLERANCE


def test_check_fails_when_the_weights_differ():
    ours, ref, x, pad = bm.build(SMALL)
    with torch.no_grad():  # swap the key and value rows of torch's in_proj: what a wrong loader would do
        w = ref.layers[1].self_attn.in_proj_weight
        w.copy_(torch.cat([w[:32], w[64:], w[32:64]]))
    assert not bm.check(ours, ref, x, pad)["passed"]


def test_forced_impl_reaches_every_norm_call_and_restores():
    ours, _, x, pad = bm.build(SMALL)
    before = {n: getattr(F, n) for n in ("layer_norm", "add_layer_norm", "rms_norm", "add_rms_norm")}
    with bm.forced_impl("reference"):
        assert all(getattr(F, n).keywords == {"impl": "reference"} for n in before)
        with torch.no_grad():
            y_ref = ours(x, pad)
    assert all(getattr(F, n) is fn for n, fn in before.items())
    with torch.no_grad():
        torch.testing.assert_close(ours(x, pad), y_ref, rtol=1e-5, atol=1e-5)


def test_bench_model_run_reports_ratios():
    result = bm.run(SMALL, repeats=1, warmup=0)
    assert result["correctness"]["passed"]
    for mode in ("train_step", "inference"):
        assert set(result[mode]["ms"]) == {"normlab", "torch", "native"}
        assert all(v > 0 for v in result[mode]["speedup_vs_torch"].values())
    assert "| normlab |" in bm.markdown(result)
