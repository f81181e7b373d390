"""Parameter and FLOP accounting, and the lesson-003 figures."""
import pytest

import normlab
from normlab.cli import main
from normlab.lab import accounting


def test_bert_base_figures():
    r = accounting.count_preset("bert-base")
    p = r["params"]
    assert {row["params"] for row in p["per_layer"]} == {3072}
    assert p["in_layers"] == 36864
    assert p["outside_layers"] == 1536  # the embedding LayerNorm
    assert 108_000_000 < p["total_model"] < 110_000_000  # BERT-base encoder without pooler
    assert r["flops"]["per_norm"] == 5 * 768 == 3840
    assert r["flops"]["per_norm"] * 512 == pytest.approx(2e6, rel=0.02)


def test_counts_on_a_normlab_model():
    m = normlab.TransformerEncoder(16, 2, 3, norm="rmsnorm", placement="sandwich")
    p = accounting.norm_parameters(m)
    assert [row["params"] for row in p["per_layer"]] == [4 * 16] * 3  # 4 RMSNorms x gamma
    assert p["outside_layers"] == 16  # final norm
    f = accounting.flops_per_token(16, 64, 10, norm="rmsnorm")
    assert f["per_norm"] == 48 and f["attention"] == 8 * 256 + 4 * 10 * 16 and f["ffn"] == 4 * 16 * 64


def test_cli_count(capsys):
    assert main(["count", "--preset", "bert-base"]) == 0
    out = capsys.readouterr().out
    assert "3,072" in out and "36,864" in out and "3,840" in out
    assert main(["count", "--preset", "nope"]) == 2
