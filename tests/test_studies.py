"""Study runner (store, resume, divergence, errors) and every study at test size."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from normlab.studies import STUDIES, load
from normlab.studies.base import Context
from normlab.studies.runner import Runner, Store, cell_key
from normlab.studies.task import final_loss, train_cell


def square_cell(cfg: dict) -> dict:
    if cfg["x"] < 0:
        raise ValueError("negative input")
    return {"y": cfg["x"] ** 2}


def test_store_resumes_without_recomputing(tmp_path):
    store = Store(str(tmp_path / "runs.sqlite"))
    r = Runner(store)
    first = r.map("demo", square_cell, [{"x": 1}, {"x": 2}])
    assert [c["y"] for c in first] == [1, 4] and r.ran == 2
    # a "killed" sweep: a new runner over the same store finds the finished cells
    r2 = Runner(Store(str(tmp_path / "runs.sqlite")))
    again = r2.map("demo", square_cell, [{"x": 1}, {"x": 2}, {"x": 3}])
    assert [c["y"] for c in again] == [1, 4, 9] and r2.ran == 1
    assert store.count("demo") == 3
    assert cell_key(square_cell, {"x": 1}) != cell_key(square_cell, {"x": 2})


def test_failing_cell_is_recorded_not_raised(tmp_path):
    r = Runner(Store(str(tmp_path / "runs.sqlite")))
    out = r.map("demo", square_cell, [{"x": -1}, {"x": 3}])
    assert out[0]["status"] == "error" and "negative input" in out[0]["error"]
    assert out[1]["y"] == 9
    again = Runner(Store(str(tmp_path / "runs.sqlite")))
    again.map("demo", square_cell, [{"x": -1}, {"x": 3}])
    assert again.ran == 1  # the error is retried, the finished cell is not


def test_parallel_jobs_match_serial(tmp_path):
    cfgs = [{"x": i} for i in range(5)]
    serial = Runner(Store(str(tmp_path / "a.sqlite"))).map("demo", square_cell, cfgs)
    parallel = Runner(Store(str(tmp_path / "b.sqlite")), jobs=2).map("demo", square_cell, cfgs)
    assert [c["y"] for c in serial] == [c["y"] for c in parallel]


def test_divergence_is_recorded_with_its_step():
    r = train_cell({"placement": "post", "norm": "none", "layers": 2, "lr": 1e4, "steps": 40, "seed": 0})
    assert r["status"] == "diverged" and 0 <= r["diverged_step"] < 40
    assert final_loss(r) == math.inf


def test_training_loss_falls():
    r = train_cell({"placement": "pre", "layers": 2, "lr": 3e-3, "steps": 60, "seed": 0})
    assert r["status"] == "ok" and r["curve"][-1] < r["curve"][0] - 0.3


@pytest.fixture(scope="module")
def test_scale_results(tmp_path_factory):
    """Every study at test size, run once for the module (the direction checks below read it)."""
    out = tmp_path_factory.mktemp("report")
    ctx = Context(Runner(Store(str(out / "runs.sqlite")), jobs=1), "test", out / "figures")
    return {name: load(name).run(ctx) for name in STUDIES}, out


def _claims(results):
    return {c["id"]: c for r in results.values() for c in r["claims"]}


def test_every_study_returns_claims_and_a_figure(test_scale_results):
    results, out = test_scale_results
    no_speech = shutil.which("espeak-ng") is None  # the diarization study cannot simulate: SKIP, no figure
    for name, r in results.items():
        assert r["claims"], name
        skipped = name == "diarization" and no_speech
        if not skipped:
            assert (out / "figures" / r["figure"]).stat().st_size > 5000, name
        for c in r["claims"]:
            assert set(c) >= {"id", "statement", "source", "measured", "criterion", "verdict"}
            assert c["verdict"] in (("SKIP",) if skipped else ("PASS", "FAIL"))
            json.dumps(c)


def test_exact_claims_pass_at_test_size(test_scale_results):
    """Claims that do not depend on training size hold exactly."""
    c = _claims(test_scale_results[0])
    for cid in ("1", "8", "14", "15", "L1", "L2", "L3", "L4", "2", "11"):
        assert c[cid]["verdict"] == "PASS", (cid, c[cid]["measured"])


def test_directions_at_test_size(test_scale_results):
    """Trained claims at 60 steps: the direction of each effect, not its published size."""
    c = _claims(test_scale_results[0])
    warm = c["5"]["measured"]["mean final loss"]
    assert warm["post, no warmup"] > warm["pre, no warmup"]
    assert warm["post, no warmup"] > warm["post, 100-step warmup"] or warm["post, no warmup"] > 2.0
    trained = c["G1"]["measured"]["cells trained (loss < 0.5)"]
    assert trained["pre"] >= trained["post"]
    upd = c["7"]["measured"]
    key = next(k for k in upd if k.startswith("delta"))
    assert upd[key]["post"] > upd[key]["pre"]
    grad = c["4"]["measured"]["mean(top third)/mean(bottom third)"]
    assert grad["post/L12"] > grad["pre/L12"]


def test_report_writes_html_and_json(tmp_path):
    from normlab.studies.report import run_studies, verdict_table

    result = run_studies(tmp_path, scale="test", only=["lesson_stats", "invariance"], progress=False)
    page = (tmp_path / "index.html").read_text()
    assert "data:image/png;base64," in page and "PASS" in page
    data = json.loads((tmp_path / "results.json").read_text())
    assert {c["id"] for c in data["claims"]} >= {"1", "14", "L1"}
    assert (tmp_path / "runs.sqlite").exists()
    assert "passed" in verdict_table(result)
    again = run_studies(tmp_path, scale="test", only=["lesson_stats", "invariance"], progress=False)
    assert again["cells_computed"] == 0  # everything came from the store
