"""The benchmark harness: rows consistent with their own numbers, the table written from them."""
from __future__ import annotations

import pytest

from normlab.lab import bench


def test_bench_rows_are_consistent():
    rows = bench.bench_one("add_rms_norm", (64, 32), "float32", copy_speed=10.0, repeats=3, warmup=1)
    assert [r.mode for r in rows] == ["fwd", "fwd+bwd"]
    for r in rows:
        # the row holds ms rounded to 1 us and the ratio to 0.01: allow for both roundings
        assert r.ratio == pytest.approx(r.torch_ms / r.normlab_ms, rel=0.05, abs=0.006)
        assert r.gbps > 0 and r.floor_pct > 0
    assert rows[1].saved_mb_normlab is not None
    text = bench.markdown({"machine": bench.machine(), "copy_gbps": 10.0, "rows": [vars(r) for r in rows]})
    assert text.count("| add_rms_norm |") == 2


def test_gpu_section_is_skipped_with_a_message_without_cuda(monkeypatch, tmp_path, capsys):
    from normlab.cli import main
    from normlab.lab import bench_gpu

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert bench_gpu.run() == {"skipped": "no CUDA device: GPU section skipped"}
    assert bench_gpu.markdown(bench_gpu.run()) == "GPU: no CUDA device: GPU section skipped."
    assert main(["bench", "--ops", "rms_norm", "--shapes", "64x32", "--dtypes", "float32", "--repeats", "1",
                 "--threads", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| rms_norm | 64x32 |" in out and "GPU: no CUDA device: GPU section skipped." in out
    import json

    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["gpu"] == {"skipped": "no CUDA device: GPU section skipped"}
    assert saved["provenance"]["normlab"] and saved["provenance"]["threads"] == 1
    assert main(["bench", "--device", "cuda", "--out", str(tmp_path)]) == 2  # no GPU: one line, no traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda: no CUDA GPU is available" in err
