"""Study runner (store, resume, divergence, errors) and every study at test size."""
from __future__ import annotations

import json
import math
import re
import shutil

import pytest

from normlab._checks import CellsFailed
from normlab.studies import STUDIES, load
from normlab.studies.base import Context
from normlab.studies.criteria import CRITERIA
from normlab.studies.init_depth import gradient_claim_holds, loglog_slope
from normlab.studies.runner import Runner, Store, cell_key
from normlab.studies.task import CHANCE, final_loss, train_cell

SCALED = {"3", "4", "5", "6", "9", "7a", "7b"}  # criteria that name a depth or step count, smaller at test size


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


def test_failing_cell_is_recorded_the_sweep_goes_on_then_it_raises(tmp_path):
    r = Runner(Store(str(tmp_path / "runs.sqlite")))
    # no study reads an error as a result (a missing final loss read as a divergence and decided a claim)
    with pytest.raises(CellsFailed, match=r"1 of 2 cells of demo failed \(first, x=-1: ValueError: negative input\)"):
        r.map("demo", square_cell, [{"x": -1}, {"x": 3}])
    assert r.ran == 2  # the other cell ran and is kept
    again = Runner(Store(str(tmp_path / "runs.sqlite")))
    with pytest.raises(CellsFailed):
        again.map("demo", square_cell, [{"x": -1}, {"x": 3}])
    assert again.ran == 1  # the error is retried, the finished cell is not
    assert again.map("demo", square_cell, [{"x": 3}])[0]["y"] == 9


def _two_lines(cfg: dict) -> dict:
    raise RuntimeError("shape mismatch\n  at layer 3")


def test_a_failed_cell_s_message_stays_one_whole_line(tmp_path):
    """The CLI prints a UserError's first line: a two-line cell error cut the message before its hint."""
    with pytest.raises(CellsFailed) as e:
        Runner(Store(str(tmp_path / "runs.sqlite"))).map("demo", _two_lines, [{"x": 1}])
    assert "\n" not in str(e.value) and str(e.value).endswith("run the same command again to retry the failed ones")


def _out_of_memory(cfg: dict) -> dict:
    raise RuntimeError("not enough memory")


def test_a_study_with_failed_cells_gives_no_verdict_and_the_others_still_run(tmp_path, monkeypatch):
    from normlab.studies import lesson_stats
    from normlab.studies.report import run_studies

    monkeypatch.setattr(lesson_stats, "stats_cell", _out_of_memory)
    with pytest.raises(CellsFailed, match="of lesson_stats failed .*not enough memory"):
        run_studies(tmp_path, only=["lesson_stats", "invariance"], progress=False)
    assert not (tmp_path / "results.json").exists()  # a report without lesson_stats would read whole
    assert Store(str(tmp_path / "runs.sqlite")).count("invariance") == 1  # the next study ran and is kept


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
    ctx = Context(Runner(Store(str(out / "runs.sqlite")), jobs=2), "test", out / "figures")
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
            assert set(c) >= {"id", "statement", "source", "measured", "criterion", "verdict", "uncertainty"}
            assert c["verdict"] in (("SKIP",) if skipped else ("PASS", "FAIL"))
            assert skipped or c["uncertainty"], c["id"]  # every verdict comes with its seed-level spread
            assert "status" not in c["measured"], c["id"]  # the store's bookkeeping is no measurement
            json.dumps(c)


def test_every_claim_prints_its_registered_criterion(test_scale_results):
    """The printed criterion is CRITERIA[id] (at test size, with the test-size depths/steps filled in)."""
    c = _claims(test_scale_results[0])
    assert set(c) == set(CRITERIA)
    for cid, row in c.items():
        pattern = re.escape(CRITERIA[cid].template)
        pattern = re.sub(r"\\\{\w+\\\}", ".+?", pattern)
        assert re.fullmatch(pattern, row["criterion"]), (cid, row["criterion"])
        if cid not in SCALED:
            assert row["criterion"] == CRITERIA[cid].text, cid


def test_exact_claims_pass_at_test_size(test_scale_results):
    """Claims that do not depend on training size hold exactly (2 and 11: at init, 8 seeds)."""
    c = _claims(test_scale_results[0])
    for cid in ("1", "8", "14", "15", "L1", "L2", "L3", "L4", "2", "11"):
        assert c[cid]["verdict"] == "PASS", (cid, c[cid]["measured"])
    assert set(c["8"]["measured"]["alpha"]) == {"attn", "ffn"}  # both residual units' alpha are checked


def test_init_gradient_directions(test_scale_results):
    """Claims 3, 4, 10 at test size (L = 6 and 12, 20 seeds): the theorem's quantities move as predicted."""
    c = _claims(test_scale_results[0])
    per_pos = c["3"]["measured"]["per-position g12/g6"]
    predicted = c["3"]["measured"]["pre predicted sqrt(||x_6||^2/||x_L||^2)"]
    assert per_pos["pre"] < 0.85 and abs(per_pos["pre"] - predicted) < 0.1  # ~1/||x_L||
    assert abs(per_pos["post"] - 1) < 0.15  # flat in depth
    c3 = CRITERIA["3"]  # "flat" is two-sided: a Post-LN gradient growing with depth fails
    holds = [gradient_claim_holds({"pre": a, "post": b}, c3) for a, b in ((0.5, 1.2), (0.5, 1.5), (0.5, 0.7), (0.8, 1))]
    assert holds == [True, False, False, False]
    assert c["3"]["verdict"] == ("PASS" if gradient_claim_holds(per_pos, c3) else "FAIL")
    tb = c["4"]["measured"]["expected gradient, mean(top third)/mean(bottom third)"]
    assert tb["post/L12"] > 1.1 and tb["post/L12"] > tb["post/L6"]  # larger near the output, more so deeper
    assert tb["pre/L12"] < 0.9 and 0.8 <= tb["deepnorm/L12"] <= 1.25  # Pre-LN falls toward the output (not flat)
    flat = all(0.8 <= tb[f"{p}/L{n}"] <= 1.25 for p in ("pre", "deepnorm") for n in (6, 12))
    larger = all(tb[f"post/L{n}"] > 1.1 for n in (6, 12))
    assert c["4"]["verdict"] == ("PASS" if flat and larger else "FAIL")
    b = c["10"]["measured"]
    assert abs(b["post mean"] - b["predicted"]) < 0.03 and b["pre last"] < b["post mean"] / 5
    lo, hi = b["post min, max over layers"]
    assert lo <= b["post mean"] <= hi and -1.5 < b["pre log-log slope"] < -0.3  # Pre-LN's branch share decays
    assert abs(loglog_slope([3 / i for i in range(1, 13)]) + 1) < 1e-12  # 1/l reads -1


def test_update_size_directions(test_scale_results):
    """Claims 7a/7b at L = 6 -> 50: Post grows at least linearly, Pre and Admin sublinearly (7a); Adam's step
    keeps the order (7b)."""
    c = _claims(test_scale_results[0])
    a = c["7a"]["measured"]
    grow, linear = a["d(L=50)/d(6)"], a["depth ratio 50/6 (linear growth)"]
    assert grow["post"] > linear > max(grow["pre"], grow["admin"])
    assert a["post/deepnorm at L=50"] >= 10
    b = c["7b"]["measured"]["d(L=50)/d(6)"]
    assert b["post"] > b["pre"] and b["post"] > b["admin"] and c["7b"]["measured"]["post/deepnorm at L=50"] >= 10


class _FakeRunner:
    """A runner that computes nothing: each cell's result is ``result(cfg)``; it keeps the configs it was given."""

    def __init__(self, result):
        self.result, self.seen = result, []
        self.run_id = "fake"

    def map(self, study, fn, cfgs):
        self.seen.extend(cfgs)
        return [self.result(c) for c in cfgs]


def _trained_to(loss):
    """A runner whose training cells end at the loss ``loss(cfg)`` (None: diverged), without training."""
    return _FakeRunner(lambda cfg: {"final_loss": loss(cfg), "curve": [3.0, 1.0]})


def test_deepnorm_must_move_least_of_all_placements(tmp_path):
    """"DeepNorm's is smallest" was tested against Post-LN only: a DeepNorm change above Pre-LN's must fail 7a."""
    growth = {"post": 40.0, "pre": 3.0, "admin": 4.0, "deepnorm": 5.0}  # growth from L = 6 to the top depth
    at_top = {"post": 100.0, "pre": 1.0, "admin": 1.2, "deepnorm": 2.0}  # ...and the change there (L = 50)
    fake = _FakeRunner(lambda c: {k: at_top[c["placement"]] / (1 if c["layers"] == 50 else growth[c["placement"]])
                                  for k in ("delta_random", "delta_adam")})

    c = {r["id"]: r for r in load("update_size").run(Context(fake, "test", tmp_path))["claims"]}
    assert c["7a"]["measured"]["post/deepnorm at L=50"] >= 10 and not c["7a"]["measured"]["deepnorm smallest at L=50"]
    assert c["7a"]["verdict"] == c["7b"]["verdict"] == "FAIL"
    at_top["deepnorm"] = 0.5
    assert all(r["verdict"] == "PASS" for r in load("update_size").run(Context(fake, "test", tmp_path))["claims"])


def test_update_size_verdicts_hold_on_a_disjoint_seed_set(test_scale_results, tmp_path):
    """Seeds 100-101 give the verdicts of seeds 0-1 (docs/studies.md shows the same for every quick claim)."""
    ctx = Context(Runner(Store(str(tmp_path / "runs.sqlite")), jobs=2), "test", tmp_path / "figures", seed_offset=100)
    other = {c["id"]: c["verdict"] for c in load("update_size").run(ctx)["claims"]}
    first = _claims(test_scale_results[0])
    assert other == {cid: first[cid]["verdict"] for cid in other} and set(other) == {"7a", "7b"}


def test_training_directions(test_scale_results):
    """Trained claims at 160 steps (L = 6): the direction of each effect, not its published size."""
    c = _claims(test_scale_results[0])
    warm = c["5"]["measured"]["mean final loss"]
    assert warm["post, no warmup"] > warm["pre, no warmup"] + 1
    assert warm["post, no warmup"] > warm["post, 100-step warmup"] or warm["post, no warmup"] > 2.0
    deep = c["6"]["measured"]
    assert deep["post lr 0.001"] > deep["pre lr 0.001"] + 1
    assert deep["post lr 0.003"] > max(deep["pre lr 0.003"], deep["deepnorm lr 0.003"]) + 1
    admin = c["9"]["measured"]["admin lr 1e-3"]
    assert admin < CHANCE - 1 and admin < deep["post lr 0.001"]  # Admin trains where Post does not (yet)
    c9 = CRITERIA["9"]  # Admin passes only where plain Post-LN fails in the same setting (the counterfactual)
    assert c["9"]["measured"]["post lr 1e-3"] == deep["post lr 0.001"]
    post_fails = c["6"]["measured"]["post fails in a majority of seeds"]["lr 0.001"]
    assert c["9"]["verdict"] == ("PASS" if admin < c9["trained"] and post_fails else "FAIL")
    assert c["13"]["measured"]["dyt"] < CHANCE - 1  # DyT trains past the plateau like LayerNorm
    q = c["12b"]["measured"]
    assert max(q["rmsnorm"], q["layernorm"]) < CHANCE - 1 and abs(q["difference"]) < 0.5
    trained = c["G1"]["measured"]["cells trained (majority of seeds)"]
    assert trained["pre"] >= trained["post"]
    deepest = next(v for k, v in c["G2"]["measured"].items() if k.startswith("mean final loss at L="))
    assert all(float(deepest["none"][lr]) > float(deepest["pre"][lr]) for lr in deepest["pre"])  # worse at depth
    # 12a is a timing: its direction is the machine's, the verdict must be the criterion applied to it
    ms, crit = c["12a"]["measured"]["ms"], CRITERIA["12a"]
    assert ms["rmsnorm"] > 0 and ms["layernorm"] > 0
    assert c["12a"]["verdict"] == ("PASS" if ms["rmsnorm"] / ms["layernorm"] <= crit["max"] else "FAIL"), ms


def test_one_diverged_seed_does_not_decide_that_post_ln_fails(tmp_path):
    """Claims 6 and 9 with deep Post-LN training in 2 of 3 seeds and diverging in one: its mean is infinite,
    above any limit, but Post-LN did not fail: both claims must FAIL (they passed on the mean)."""
    def loss(cfg):
        if cfg["placement"] == "post" and cfg["layers"] == 12 and cfg["warmup"] == 0:
            return None if cfg["seed"] == 0 else 0.001
        return 0.001

    c = {r["id"]: r for r in load("training").run(Context(_trained_to(loss), "quick", tmp_path))["claims"]}
    assert float(c["6"]["measured"]["post lr 0.001"]) == math.inf
    assert c["6"]["verdict"] == c["9"]["verdict"] == "FAIL"

    def fails(cfg):  # the same, with the two other seeds failing too: Post-LN fails, Admin makes it train
        return 3.3 if cfg["placement"] == "post" and cfg["layers"] == 12 and cfg["seed"] else loss(cfg)

    c = {r["id"]: r for r in load("training").run(Context(_trained_to(fails), "quick", tmp_path))["claims"]}
    assert c["6"]["verdict"] == c["9"]["verdict"] == "PASS"


def test_g2_counts_cells_with_its_own_threshold(tmp_path, monkeypatch):
    """G2 read G1's limit: with a G2 limit no run reaches, G2 must count no trained cell while G1 counts all."""
    from normlab.studies import criteria

    monkeypatch.setitem(criteria.CRITERIA, "G2", criteria.CRITERIA["G2"].at(trained=1e-12))
    c = {r["id"]: r for r in load("training").run(Context(_trained_to(lambda cfg: 0.001), "quick",
                                                           tmp_path))["claims"]}
    cells = c["G1"]["measured"]["cells"]
    assert c["G1"]["measured"]["cells trained (majority of seeds)"]["pre"] == cells > 0
    assert c["G2"]["measured"]["cells trained (majority of seeds)"] == {"none": 0, "pre": 0}
    assert c["G2"]["verdict"] == "FAIL"


def test_the_timing_cell_is_keyed_by_the_machine(tmp_path):
    """12a's cell is a timing: a store carried to another machine must time again, not reuse its numbers."""
    from normlab import provenance
    from normlab.studies import rms_speed

    fake = _FakeRunner(lambda cfg: {"ms": {"layernorm": 2.0, "rmsnorm": 1.0},
                                    "ms_per_repeat": {"layernorm": [2.0], "rmsnorm": [1.0]}})
    rms_speed.run(Context(fake, "test", tmp_path))
    assert provenance.cpu_name() in fake.seen[0]["machine"]


def test_the_timing_cell_is_timed_again_by_every_run(tmp_path, monkeypatch):
    """A 12a timing taken on a busy machine was read back from the store by every later run: one busy moment
    fixed a FAIL in that folder for good."""
    from normlab.studies import criteria, rms_speed

    monkeypatch.setitem(criteria.CRITERIA, "12a", criteria.CRITERIA["12a"].at(n=64, d=16, repeats=1))
    store = Store(str(tmp_path / "runs.sqlite"))
    first = Runner(store)
    rms_speed.run(Context(first, "test", tmp_path / "f1"))
    rms_speed.run(Context(first, "test", tmp_path / "f1"))  # within a run (a retry) the timing is kept
    assert first.ran == 1
    again = Runner(store)
    rms_speed.run(Context(again, "test", tmp_path / "f2"))
    assert again.ran == 1


def test_a_partial_rerun_never_joins_a_report_of_another_scale(tmp_path, monkeypatch):
    """`normlab study X` into a report folder keeps the other studies' claims: only of the same scale and
    seeds, else one line (and the report is kept), or the old claims dropped with --overwrite."""
    import torch

    from normlab import provenance
    from normlab._checks import BadValue
    from normlab.studies.report import run_studies

    run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False)
    before = (tmp_path / "results.json").read_text()
    with pytest.raises(BadValue, match="a test report with seed offset 0 on cpu; a test run with seed offset 100"):
        run_studies(tmp_path, scale="test", only=["invariance"], progress=False, seed_offset=100)
    # GPU verdicts never join CPU ones (the merged report took the new run's device for every study)
    with pytest.raises(BadValue, match="on cpu; a test run with seed offset 0 on cuda of some studies cannot join"):
        run_studies(tmp_path, scale="test", only=["invariance"], progress=False, device="cuda")
    assert (tmp_path / "results.json").read_text() == before
    with monkeypatch.context() as m:  # the code changed between the two runs (a dirty commit reads the same)
        m.setattr(provenance, "code_digest", lambda: "edited")
        joined = run_studies(tmp_path, scale="test", only=["invariance"], progress=False, jobs=2)
    assert {c["study"] for c in joined["claims"]} == {"lesson_stats", "invariance"}
    runs = {s["name"]: s["run"] for s in joined["studies"]}  # each study says how its own cells ran
    assert runs["invariance"]["source_digest"] == "edited" != runs["lesson_stats"]["source_digest"]
    assert runs["lesson_stats"]["torch"] == torch.__version__
    assert (runs["lesson_stats"]["jobs"], runs["invariance"]["jobs"]) == (1, 2)
    assert (runs["lesson_stats"]["threads_per_cell"], runs["invariance"]["threads_per_cell"]) == (2, 1)
    alone = run_studies(tmp_path, scale="test", only=["invariance"], progress=False, seed_offset=100, overwrite=True)
    assert {c["study"] for c in alone["claims"]} == {"invariance"} and alone["seed_offset"] == 100


def test_diarization_verdicts_follow_the_measurements(test_scale_results):
    """D1, D2 at test size (20 steps, too few for a direction): every test set is scored (the real persons'
    conversations too, where their prompts are installed), and each verdict is its criterion applied to every set's
    mean DER over seeds."""
    from normlab.studies.diarization import real_persons

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed: the diarization study reports SKIP")
    c = _claims(test_scale_results[0])
    der = c["D1"]["measured"]["mean DER"]
    assert set(der) == ({"synthetic", "real persons"} if real_persons() else {"synthetic"})
    assert all(0 < float(v) < 1 for per_set in der.values() for v in per_set.values())
    d1 = all(float(m["pre"]) <= float(m["post"]) + 0.01 for m in der.values())
    d2 = all(float(m["none"]) > float(m["pre"]) + 0.01 for m in der.values())
    assert (c["D1"]["verdict"], c["D2"]["verdict"]) == ("PASS" if d1 else "FAIL", "PASS" if d2 else "FAIL")
    assert all(t in c["D1"]["uncertainty"] for t in der)  # each set's per-seed spread is printed


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
    # its own figures are replaced on that rerun; a picture of the user's under a figure's name is not
    from normlab._checks import BadValue

    figure = tmp_path / "figures" / "lesson_stats.png"
    figure.write_bytes(b"my picture")
    with pytest.raises(BadValue, match=f"{figure.name} exists and normlab did not write it"):
        run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False)
    assert figure.read_bytes() == b"my picture"
    # a picture under a name no study draws (or of a study this run does not draw) is no reason to refuse: it
    # stopped every report into the folder ("my_plot.png exists and normlab did not write it")
    (tmp_path / "figures" / "my_plot.png").write_bytes(b"mine too")
    run_studies(tmp_path, scale="test", only=["invariance"], progress=False)
    assert (tmp_path / "figures" / "my_plot.png").read_bytes() == b"mine too"


def test_the_diarization_study_simulates_one_folder_per_recipe(tmp_path):
    """A folder keeps every mixture simulated into it and the study reads them all: a recipe with fewer
    conversations must not land in the folder of a larger one (it trained on 1040 where its key said 140)."""
    from normlab.studies.diarization import data_folder

    recipe = {"n_train": 140, "n_test": 20, "seed": 0}
    here = data_folder(tmp_path, "quick", True, recipe)
    assert here == data_folder(tmp_path, "quick", True, dict(reversed(recipe.items())))  # the same recipe
    assert here != data_folder(tmp_path, "quick", True, {**recipe, "n_train": 1040})
    assert here != data_folder(tmp_path, "quick", False, recipe) != data_folder(tmp_path, "full", True, recipe)
    assert here.parent == tmp_path / "diarization-data"


def test_d2_needs_a_margin_and_a_finite_pre_ln():
    """No norm 'worse' than Pre-LN by a hundredth of a point is not worse (D1 has its 1-point margin too)."""
    from normlab.studies.diarization import worse

    assert worse(0.31, 0.295, 0.01) and not worse(0.30, 0.295, 0.01) and worse(math.inf, 0.2, 0.01)
    assert not worse(math.inf, math.inf, 0.01) and not worse(0.5, math.inf, 0.01)


def test_d1_never_passes_a_diverged_pre_ln():
    from normlab.studies.diarization import no_worse

    assert no_worse(0.20, 0.195, 0.01) and not no_worse(0.30, 0.20, 0.01)
    assert not no_worse(math.inf, math.inf, 0.01) and not no_worse(math.inf, 0.2, 0.01)
    assert no_worse(0.25, math.inf, 0.01)


def test_a_diverged_diarization_run_reads_der_inf_instead_of_failing_the_report(monkeypatch, tmp_path):
    """The recipe stops a diverged training with one line (right for its user), and the study's cell let that
    error through: the report stopped ("1 of 1 cell of diarization failed"), and a rerun diverged again, where
    the docs promise a diverged run reads DER = inf (a result: D2's no-norm seeds may diverge)."""
    import math
    import pickle

    from normlab.diarization.training import recipe
    from normlab.studies.diarization import der_cell

    def diverges(data, out, rc):
        raise recipe.TrainingDiverged("training diverged at step 3", 3, math.nan, [0.9, 0.8])

    monkeypatch.setattr(recipe, "train_model", diverges)
    monkeypatch.setattr(recipe, "score_model", lambda *a: pytest.fail("a diverged model was scored"))
    got = der_cell({"data": str(tmp_path), "recipe": {}, "placement": "pre", "norm": "none", "seed": 0,
                    "sets": {"synthetic": "test"}})
    assert got["der"] == got["der_collar0"] == math.inf and math.isnan(got["final_loss"])
    assert got["losses"] == [pytest.approx(0.85)]  # the curve up to the divergence
    again = pickle.loads(pickle.dumps(recipe.TrainingDiverged("m", 3, 1.0, [0.5])))  # crosses worker processes
    assert (str(again), again.step, again.losses) == ("m", 3, [0.5]) and isinstance(again, ValueError)


def _init_cell_result(cfg):
    """init_depth's cells without computing: rows per layer, gradients per layer."""
    if "batches" in cfg:  # grad_cell
        return {"last_per_position_rms": 1.0, "w2_one_batch": [1.0] * cfg["layers"], "last_x_norm2_per_d": 1.0,
                "w2_expected": [1.0] * cfg["layers"]}
    return {"rows": [{"resid_norm2_per_d": 1.0, "ffn_sum_norm2_per_d": 1.5, "branch_ratio_ffn": 0.5,
                      "cos_prev": 0.9}] * cfg["layers"]}


def test_each_init_claim_runs_at_its_own_settings(monkeypatch, tmp_path):
    """Claims 3, 10 and 11 read their depth and seeds from their own entries, not from claims 4 and 2 (equal
    today: an edit of one claim moved another silently)."""
    monkeypatch.setitem(CRITERIA, "3", CRITERIA["3"].at(seeds=5, top=12))
    monkeypatch.setitem(CRITERIA, "10", CRITERIA["10"].at(layers=12))
    monkeypatch.setitem(CRITERIA, "11", CRITERIA["11"].at(layers=18))
    fake = _FakeRunner(_init_cell_result)
    c = {r["id"]: r for r in load("init_depth").run(Context(fake, "full", tmp_path))["claims"]}
    assert "per-position g12/g6" in c["3"]["measured"] and "over 5 seeds" in c["3"]["uncertainty"]
    assert "pre layer 18" in c["11"]["measured"]
    grads = {(g["layers"], g["seed"]) for g in fake.seen if "batches" in g}
    assert {n for n, _ in grads} == {6, 12, 24}  # claim 4's depths and claim 3's top
    rows = {g["layers"] for g in fake.seen if "batches" not in g and "zero_qk" not in g}
    assert rows == {12, 18}  # claim 10's and claim 11's task models


def test_claim_9_reads_its_own_limit(monkeypatch, tmp_path):
    """Claim 9 decided "plain Post-LN fails" with claim 6's limit while printing its own."""
    monkeypatch.setitem(CRITERIA, "9", CRITERIA["9"].at(post_fail=1.0))
    stuck = _trained_to(lambda cfg: 1.5 if cfg["placement"] == "post" and cfg["warmup"] == 0 else 0.001)
    c = {r["id"]: r for r in load("training").run(Context(stuck, "quick", tmp_path))["claims"]}
    assert c["6"]["verdict"] == "FAIL"  # 1.5 is not above claim 6's 2.0
    assert c["9"]["verdict"] == "PASS" and "stays above 1 in a majority" in c["9"]["criterion"]


def test_a_file_named_metrics_in_the_folder_is_refused_before_any_work(tmp_path):
    """`metrics` as a file was found when the first training cell wrote its curve: that cell and the one beside
    it were lost, on every run."""
    from normlab._checks import BadValue
    from normlab.studies.report import run_studies

    (tmp_path / "metrics").write_text("mine\n")
    with pytest.raises(BadValue, match=r"metrics is a file, not a folder \(the studies' training curves go there\)"):
        run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False)
    assert not (tmp_path / "runs.sqlite").exists() and (tmp_path / "metrics").read_text() == "mine\n"


@pytest.mark.parametrize("foreign", [
    '{"scale": "test", "claims": [{"id": "Z9", "study": "training", "statement": "made up", "source": "me", '
    '"measured": {}, "criterion": "none", "verdict": "PASS"}], "studies": [{"name": "training", "title": "t", '
    '"figure": null, "seconds": 0}]}',
    '{"scale": "test", "claims": [{"id": "x"}], "studies": [{"title": "t"}]}',
    '{"scale": "test", "claims": "oops", "studies": []}',
], ids=["a-made-up-claim", "not-a-report-s-shape", "claims-not-a-list"])
def test_a_results_json_normlab_did_not_write_is_replaced_not_joined(tmp_path, foreign):
    """--overwrite replaced a foreign results.json by name only: its claims were published beside the run's as
    normlab's verdicts, or (not shaped like a report) stopped the run after its cells with a KeyError."""
    from normlab._checks import BadValue
    from normlab.studies.report import run_studies

    (tmp_path / "results.json").write_text(foreign)
    with pytest.raises(BadValue, match="results.json exists and normlab did not write it"):
        run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False)
    result = run_studies(tmp_path, scale="test", only=["lesson_stats"], progress=False, overwrite=True)
    assert {c["study"] for c in result["claims"]} == {"lesson_stats"}
    assert [s["name"] for s in result["studies"]] == ["lesson_stats"]
