"""Kernel dispatch, the compiled path's properties, and composability with torch.compile."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
from normlab import kernels
from normlab import functional as F
from normlab.kernels import fused


def test_auto_policy():
    x32, xbf = torch.randn(4, 8), torch.randn(4, 8).bfloat16()
    assert kernels.resolve("auto", "layer_norm", x32, 1e-5) == "native"
    assert kernels.resolve("auto", "layer_norm", x32, 0.0) != "native"  # torch gives NaN on constant rows there
    expected = "compiled" if fused.available() else "reference"
    assert kernels.resolve("auto", "layer_norm", xbf, 1e-5) == expected
    assert kernels.resolve("auto", "add_layer_norm", x32, 1e-5) == "native"
    assert kernels.resolve("auto", "add_layer_norm", xbf, 1e-5) == expected
    for op in ("rms_norm", "add_rms_norm"):
        assert kernels.resolve("auto", op, x32, 1e-5) == expected


def test_forced_impl_that_cannot_run_raises():
    with pytest.raises(ValueError, match="native.*rms_norm"):
        F.rms_norm(torch.randn(2, 8), 8, impl="native")
    with pytest.raises(ValueError, match="native"):
        F.layer_norm(torch.randn(2, 8).half(), 8, impl="native")


@pytest.mark.skipif(not fused.available(), reason="no compiler")
def test_compiled_records_cold_start():
    F.rms_norm(torch.randn(3, 5, dtype=torch.float64), 5, impl="compiled")
    assert any(k.startswith("rms_fwd/float64/cpu") for k in fused.COLD_START_S)


def test_col_sum_is_blocked_and_exact_in_float64():
    t = torch.randn(fused.ROW_BLOCK * 3 + 5, 7, dtype=torch.float64)
    torch.testing.assert_close(fused._col_sum(t), t.sum(0), rtol=1e-12, atol=1e-12)


def test_compiled_saves_no_more_than_torch():
    """Backward keeps only the input and per-row statistics (plus the weight)."""
    from normlab.lab.bench import saved_bytes

    x = torch.randn(512, 256, requires_grad=True)
    w = torch.randn(256, requires_grad=True)
    ours = saved_bytes(lambda: F.rms_norm(x, 256, w))
    assert ours <= x.numel() * 4 + 512 * 4 + 256 * 4
    assert ours <= saved_bytes(lambda: torch.nn.functional.rms_norm(x, [256], w))


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.rms, self.lin = normlab.LayerNorm(d), normlab.RMSNorm(d), nn.Linear(d, d)

    def forward(self, x):
        h = x + self.lin(self.ln(x))
        y, s = F.add_rms_norm(self.lin(h), h, h.shape[-1], self.rms.weight)
        return self.rms(y + s)


@pytest.mark.skipif(not fused.available(), reason="no compiler")
def test_model_compiles_fullgraph_and_matches_eager():
    torch.manual_seed(0)
    m = _Block(32)
    x = torch.randn(4, 6, 32, requires_grad=True)
    y_eager = m(x)
    g_eager = torch.autograd.grad(y_eager.sum(), [x, *m.parameters()])
    compiled = torch.compile(m, fullgraph=True)  # raises on any graph break
    y = compiled(x)
    g = torch.autograd.grad(y.sum(), [x, *m.parameters()])
    torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_bench_rows_are_consistent():
    from normlab.lab import bench

    rows = bench.bench_one("add_rms_norm", (64, 32), "float32", copy_speed=10.0, repeats=3, warmup=1)
    assert [r.mode for r in rows] == ["fwd", "fwd+bwd"]
    for r in rows:
        # the row holds ms rounded to 1 us and the ratio to 0.01: allow for both roundings
        assert r.ratio == pytest.approx(r.torch_ms / r.normlab_ms, rel=0.05, abs=0.006)
        assert r.gbps > 0 and r.floor_pct > 0
    assert rows[1].saved_mb_normlab is not None
    text = bench.markdown({"machine": bench.machine(), "copy_gbps": 10.0, "rows": [vars(r) for r in rows]})
    assert text.count("| add_rms_norm |") == 2
