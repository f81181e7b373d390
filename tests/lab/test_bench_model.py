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


def test_spread_is_the_range_over_the_median():
    assert bm._spread([10.0, 12.0, 20.0]) == pytest.approx(83.3)  # (20 - 10) / 12


def test_rounds_report_their_spread_and_the_profile_splits_the_step():
    seen = []
    result = bm.run(SMALL, repeats=1, warmup=0, rounds=2, profile=True, progress=lambda i, n, note: seen.append((i, n)))
    # each job reported when done, counted from 0 as every progress callback: the last is n - 1 of n (it said
    # n of n at the end, a bar past its end, and each round one ahead)
    assert seen == [(i, 5) for i in range(5)]
    for mode in ("train_step", "inference"):
        r = result[mode]
        for name, values in r["rounds_ms"].items():
            assert len(values) == 2
            lo, hi = min(values), max(values)
            # rounds_ms are stored rounded to 0.01 ms: allow that rounding in the recomputed spread
            assert r["spread_pct"][name] == pytest.approx(100 * (hi - lo) / ((lo + hi) / 2),
                                                          abs=0.1 + 100 * 1e-2 / ((lo + hi) / 2))
        assert len(r["speedup_rounds"]["normlab"]) == 2
    prof = result["profile"]
    assert set(prof) == {"normlab", "torch"}
    assert prof["normlab"]["ms"]["GEMMs"] > 0 and prof["normlab"]["ms"]["norms and adds"] > 0
    assert prof["normlab"]["ms"]["optimizer"] > 0
    text = bm.markdown(result)
    assert "spread of the round medians" in text and "| norms and adds |" in text
    assert f"torch's CPU kernels for {torch.backends.cpu.get_cpu_capability()}" in text  # which kernels ran


@pytest.mark.parametrize("name,part", [("aten::addmm", "GEMMs"), ("aten::mm", "GEMMs"),
                                       ("aten::_foreach_addcdiv_", "optimizer"), ("aten::addcmul_", "optimizer"),
                                       ("NormFunctionBackward", "norms and adds"), ("aten::add_", "norms and adds"),
                                       ("aten::native_layer_norm", "norms and adds"), ("aten::_softmax", "attention"),
                                       ("aten::threshold_backward", "activation"), ("aten::empty", "other")])
def test_profile_buckets(name, part):
    from normlab.lab.step_profile import bucket

    assert bucket(name) == part


def test_profile_attributes_ops_to_their_enclosing_call():
    from types import SimpleNamespace as E

    from normlab.lab.step_profile import event_bucket

    step = E(name="Optimizer.step#AdamW.step", cpu_parent=None)
    assert event_bucket(E(name="aten::sqrt", cpu_parent=step)) == "optimizer"
    assert event_bucket(E(name="aten::add_", cpu_parent=E(name="aten::mul_", cpu_parent=step))) == "optimizer"
    assert event_bucket(E(name="aten::copy_", cpu_parent=E(name="NormFunction", cpu_parent=None))) == "norms and adds"
    assert event_bucket(E(name="aten::copy_", cpu_parent=None)) == "other"
