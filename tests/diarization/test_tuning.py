"""Pipeline tuning (``pipeline/tuning.py``, ``normlab diarize tune``): the dev choice is the grid's minimum in each
mode, held-out sets are scored once with it (never re-tuned), and a saved choice becomes the model's defaults."""
import json
import pathlib

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab import UserError
from normlab.cli import main
from normlab.diarization.io.rttm import Turn, write_rttm
from normlab.diarization.models.eend import SHIPPED, EENDModel
from normlab.diarization.models.embed import SpeakerEncoder
from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.stitch import segment
from normlab.diarization.pipeline.tuning import (
    BEYOND_DOUBT,
    PREFERRED_MODE,
    SEGMENT_GRID,
    STITCH_GRID,
    VBX_GRID,
    files_of,
    keep_incumbent,
    meaningful,
    measure,
    parse_grid,
    share_better,
    tune_pipeline,
)
from tiny_diarizer import SR, tiny_models, tones

SEG = {"speakers": ("eend", "speech"), "vad": ("off", "speech"), "threshold": (0.3, 0.8), "piece": (1.5,),
       "step": (2.0,)}
STITCH = {"cluster_threshold": (0.3, 0.6), "min_cluster": (0.0,), "weighting": ("mean",),
          "overlap_threshold": (0.5, 0.7)}


def _folder(root, name, seeds):
    """A dev/test folder: two tone 'speakers' taking turns (wav/*.wav, ref.rttm)."""
    d = root / name
    (d / "wav").mkdir(parents=True)
    refs = {}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        t = np.arange(8 * SR) / SR
        voices = [0.3 * np.sin(2 * np.pi * f * t) for f in (180.0 + 20 * seed, 900.0)]
        audio = np.where((t % 4) < 2, voices[0], voices[1]) * ((t % 2) < 1.6)
        sf.write(d / "wav" / f"r{seed}.wav", (audio + 0.01 * rng.standard_normal(len(t))).astype(np.float32), SR)
        refs[f"r{seed}"] = [Turn(f"r{seed}", a, 1.6, f"s{(a // 2) % 2:.0f}") for a in np.arange(0, 8, 2.0)]
    write_rttm([t for ts in refs.values() for t in ts], d / "ref.rttm")
    return d


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    tiny_models(root, 1.0, window=4.0, median=1)  # random weights: the test is about the bookkeeping, not the DER
    return root, _folder(root, "dev", [1, 2]), _folder(root, "test", [3])


def test_grid_axes_and_meaningless_rows():
    seg, st = parse_grid(["vad=off", "threshold=0.2,0.4"], (SEGMENT_GRID, STITCH_GRID))
    assert seg["vad"] == ("off",) and seg["threshold"] == (0.2, 0.4) and SEGMENT_GRID["vad"] != ("off",)
    for bad in ("colour=red", "threshold=", "threshold=high", "cluster_threshold=nan", "piece=0", "piece=inf",
                "min_cluster=-5", "merge_threshold=nan", "offset_threshold=2"):  # each value checked before any work
        with pytest.raises(UserError, match="grid"):
            parse_grid([bad], (SEGMENT_GRID, STITCH_GRID))
    # an axis given twice: the last replaced the first without a word; a value twice ran each setting twice
    with pytest.raises(UserError, match="a second vad axis"):
        parse_grid(["vad=off", "vad=gate"], (SEGMENT_GRID, STITCH_GRID))
    with pytest.raises(UserError, match="0.3 given twice"):
        parse_grid(["threshold=0.3,0.3"], (SEGMENT_GRID, STITCH_GRID))
    assert not meaningful({"speakers": "eend", "vad": "speech"})
    assert not meaningful({"speakers": "speech", "overlap_threshold": 0.7}, {"overlap_threshold": (0.5, 0.7)})
    assert meaningful({"speakers": "eend", "vad": "off", "overlap_threshold": 0.7}, {"overlap_threshold": (0.5, 0.7)})


def test_dev_choice_is_the_minimum_and_tests_are_scored_with_it(setup):
    root, dev, test = setup
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    threads = torch.get_num_threads()
    stitch = {**STITCH, "offset_threshold": (1.0, 0.15)}  # the hold off and on
    r = tune_pipeline(model, encoder, [dev], {"held": [test]}, segment_grid=SEG, stitch_grid=stitch)
    assert torch.is_grad_enabled() and torch.get_num_threads() == threads  # the caller's process as it was
    # eend: vad off x 2 thresholds x 8 stitch settings; speech: 2 vad x 2 thresholds x 4 (no overlap axis)
    assert len(r["grid"]) == 2 * 8 + 4 * 4
    assert len({g["der_0.25"] for g in r["grid"]}) > 2  # the grid has something to choose
    for mode, kw in r["modes"].items():
        rows = [g for g in r["grid"] if g["speakers"] == mode and g["vad"] != "speech"]
        assert kw == {k: min(rows, key=lambda g: g["der_0.25"])[k] for k in kw}
    # the default mode: eend unless speech's choice is lower on the dev files beyond doubt
    share = r["mode_choice"]["other_better_share"]
    assert r["speakers"] == ("speech" if share >= BEYOND_DOUBT else "eend") and PREFERRED_MODE == "eend"
    assert r["readings"]["chosen"] == r["modes"][r["speakers"]] and r["readings"]["vad_speech"]["vad"] == "speech"
    assert all(not k.startswith("_") for g in r["grid"] for k in g)  # per-file errors stay in memory
    cfg = PipelineConfig.for_model(model, **r["readings"]["chosen"])  # the held-out set: the choice alone
    with torch.no_grad():
        segs = {w.stem: segment(model, encoder, torch.from_numpy(sf.read(w, dtype="float32")[0]), w.stem, cfg)
                for w, _ in files_of([test])}
    direct = measure(segs, {w.stem: t for w, t in files_of([test])}, cfg)
    assert direct.pop("_files") and r["test:held"]["chosen"] == pytest.approx(direct, nan_ok=True)


def test_a_test_set_that_cannot_be_scored_is_refused_before_any_work(setup, tmp_path, monkeypatch):
    """A test set without reference speech failed with ZeroDivisionError after the whole grid had run; the dev
    set given as a test set was scored as "held out"."""
    import shutil

    from normlab.diarization.pipeline import tuning

    root, dev, test = setup
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    silent = tmp_path / "silent"
    shutil.copytree(test, silent)
    (silent / "ref.rttm").write_text("SPEAKER r3 1 0.000 0.000 <NA> <NA> s0 <NA> <NA>\n")  # named, no speech
    monkeypatch.setattr(tuning, "Segmenter", lambda *a, **k: pytest.fail("segmented before checking"))
    with pytest.raises(UserError, match=r"^test set held: no recordings with reference speech in .*silent"):
        tune_pipeline(model, encoder, [dev], {"held": [silent]}, segment_grid=SEG, stitch_grid=STITCH)
    with pytest.raises(UserError, match=r"dev.? is both a dev and a test folder"):
        tune_pipeline(model, encoder, [dev], {"held": [test, dev]}, segment_grid=SEG, stitch_grid=STITCH)
    # a dev folder without speech to score was dropped without a word
    with pytest.warns(UserWarning, match=r"--dev .*silent: no recording with reference speech"), \
            pytest.raises(pytest.fail.Exception, match="segmented before checking"):
        tune_pipeline(model, encoder, [dev, silent], segment_grid=SEG, stitch_grid=STITCH)


def test_a_stopped_tuning_resumes_from_the_segmentations_it_made(setup, tmp_path, monkeypatch):
    """An interrupted `tune` kept nothing: every segmentation of the grid was made again. Each is now kept as
    it is made; the rerun reads them (the same result) and segments only what is missing."""
    from normlab.diarization.pipeline import segment_cache, tuning

    root, dev, test = setup
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    made, real = [], tuning.segment

    def counted(*args, **kw):
        made.append(args[3])
        if len(made) == 3:  # stopped in the second setting
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(tuning, "segment", counted)
    cache = segment_cache.segments_beside(tmp_path / "t.json")
    with pytest.raises(KeyboardInterrupt):
        tune_pipeline(model, encoder, [dev], segment_grid=SEG, stitch_grid=STITCH, cache=cache)
    assert len(list(cache.glob("*.pt"))) == 2  # the first setting's two recordings, kept
    made.clear()
    monkeypatch.setattr(tuning, "segment", real)
    fresh = tune_pipeline(model, encoder, [dev], segment_grid=SEG, stitch_grid=STITCH)
    monkeypatch.setattr(tuning, "segment", lambda *a, **k: made.append(a[3]) or real(*a, **k))
    resumed = tune_pipeline(model, encoder, [dev], segment_grid=SEG, stitch_grid=STITCH, cache=cache)
    assert resumed["grid"] == fresh["grid"] and resumed["modes"] == fresh["modes"]
    settings = len({(g["vad"], g["threshold"], g["speakers"]) for g in fresh["grid"]})
    assert len(made) == 2 * settings - 2  # all but the two kept
    made.clear()
    tune_pipeline(model, encoder, [dev], segment_grid=SEG, stitch_grid=STITCH, cache=cache)
    assert made == []  # everything read back
    assert all(seg_file.stat().st_size for seg_file in cache.glob("*.pt"))
    (cache / ".0123.pt.4567.tmp").write_bytes(b"half")  # what a kill inside a write leaves
    segment_cache.remove(cache)
    assert not cache.exists()
    other = EENDModel.load(root / "m.pt")  # another model's segmentations are other files
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)
    assert segment_cache.weights_digest(other) != segment_cache.weights_digest(model)


def test_vbx_settings_are_chosen_beside_the_trees_and_by_the_grid_only_where_it_tries_them(setup, monkeypatch):
    """With a PLDA model in the file, each mode's chosen segmentation is clustered at every ``VBX_GRID``
    setting and the best is kept for ``clustering="vbx"``, the mode's choice unchanged; a grid with the
    ``clustering`` axis chooses between the two on dev, the tree's best kept for ``clustering="ahc"``."""
    from normlab.diarization.pipeline import tuning, vbx

    root, dev, _ = setup
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    rng = np.random.default_rng(0)
    plda = vbx.fit_groups([rng.normal(size=(4, 256)) + rng.normal(size=256) for _ in range(6)])
    model.whitening = {"matrix": torch.eye(256), "plda": plda}
    real = tuning.measure

    def measure_(segs, refs, cfg):  # random weights tie every setting: VBx's rows get a minimum inside the grid
        r = real(segs, refs, cfg)
        if cfg.clustering == "vbx":
            r["der_0.25"] += abs(cfg.vbx_fa - 0.2) + abs(cfg.cluster_threshold - 0.3) + (cfg.min_cluster != 8.0)
        return r

    monkeypatch.setattr(tuning, "measure", measure_)
    seg = {**SEG, "speakers": ("eend",), "vad": ("off",), "threshold": (0.3,)}
    r = tune_pipeline(model, encoder, [dev], segment_grid=seg, stitch_grid=STITCH)
    n_vbx = int(np.prod([len(v) for v in VBX_GRID.values()]))
    assert len(r["grid"]) == 4 + n_vbx and sum(g["clustering"] == "vbx" for g in r["grid"]) == n_vbx
    best = min((g for g in r["grid"] if g["clustering"] == "vbx"), key=lambda g: g["der_0.25"])
    assert r["vbx"]["eend"] == {k: best[k] for k in r["vbx"]["eend"]}
    assert (best["vbx_fa"], best["cluster_threshold"], best["min_cluster"]) == (0.2, 0.3, 8.0)
    assert r["modes"]["eend"]["clustering"] == "ahc" and r["ahc"] == {}
    assert 0 <= r["vbx_better_share"]["eend"] <= 1
    # the grid tries both: the dev set as a whole chooses
    tried = {**STITCH, "clustering": ("ahc", "vbx"), "vbx_fa": (0.2, 0.3), "vbx_fb": (1.0,), "vbx_dims": (64,)}
    r = tune_pipeline(model, encoder, [dev], segment_grid=seg, stitch_grid=tried)
    assert len(r["grid"]) == 4 + 4 * 2  # the tree's rows once, VBx's for each of its settings
    top = min(r["grid"], key=lambda g: g["der_0.25"])
    assert r["modes"]["eend"] == {k: top[k] for k in r["modes"]["eend"]}
    vbx_top = min((g for g in r["grid"] if g["clustering"] == "vbx"), key=lambda g: g["der_0.25"])
    assert r["vbx"]["eend"] == {k: vbx_top[k] for k in r["vbx"]["eend"]}
    if top["clustering"] == "vbx":
        ahc_top = min((g for g in r["grid"] if g["clustering"] == "ahc"), key=lambda g: g["der_0.25"])
        assert r["ahc"]["eend"] == {k: ahc_top[k] for k in r["ahc"]["eend"]}


def test_mode_choice_needs_a_win_beyond_doubt():
    """share_better: paired bootstrap over files; a win on every file is certain, a tie or one lucky file is not."""
    files = [f"f{i}" for i in range(30)]
    b = {u: (3.0, 10.0) for u in files}
    assert share_better({u: (2.0, 10.0) for u in files}, b) == 1.0  # lower on every file
    assert share_better(b, b) == 0.0  # a tie is no win
    lucky = {**b, "f0": (0.0, 10.0), "f1": (4.5, 10.0)}  # one file much better, one worse: lower on the sum only
    assert 0.0 < share_better(lucky, b) < BEYOND_DOUBT
    assert share_better(lucky, b) == share_better(lucky, b)  # deterministic
    with pytest.raises(UserError, match="same files"):
        share_better({"f0": (1.0, 1.0)}, b)


def test_a_folder_named_twice_counts_once(tmp_path):
    d = _folder(tmp_path, "dev", [1, 2])
    once = files_of([d])
    assert len(once) == 2 and files_of([d, str(d), tmp_path / "." / "dev"]) == [(w.resolve(), t) for w, t in once]


def test_a_stored_choice_is_kept_unless_the_best_wins_beyond_doubt():
    """A re-tuned model keeps its stored settings where the grid's best is lower on dev only within its noise,
    takes the best where it is lower on every file, and takes it where the stored settings are not in the grid."""
    files = [f"f{i}" for i in range(30)]
    keys = ("speakers", "threshold", "min_cluster")

    def row(threshold, floor, errors):
        return {"speakers": "eend", "threshold": threshold, "min_cluster": floor, "_files": errors}

    old = row(0.4, 8.0, {u: (3.0, 10.0) for u in files})
    lucky = row(0.3, 4.0, {**old["_files"], "f0": (0.0, 10.0), "f1": (4.5, 10.0)})  # lower in total only
    clear = row(0.3, 4.0, {u: (2.0, 10.0) for u in files})
    stored = {"eend": {"speakers": "eend", "threshold": 0.4, "min_cluster": 8.0, "vad": "off"}}
    best = {"eend": {k: lucky[k] for k in keys}}
    kept = keep_incumbent([old, lucky], best, stored, keys)["eend"]
    assert kept["kept"] and kept["in_grid"] and kept["settings"] == {k: old[k] for k in keys}
    assert 0.0 < kept["best_better_share"] < BEYOND_DOUBT
    taken = keep_incumbent([old, clear], {"eend": {k: clear[k] for k in keys}}, stored, keys)["eend"]
    assert not taken["kept"] and taken["best_better_share"] == 1.0
    elsewhere = {"eend": {**stored["eend"], "threshold": 0.5}}
    assert keep_incumbent([old, clear], best, elsewhere, keys)["eend"] == {
        "kept": False, "in_grid": False, "best_better_share": None,
        "settings": {"speakers": "eend", "threshold": 0.5, "min_cluster": 8.0}}
    assert keep_incumbent([old, lucky], best, {}, keys) == {}  # a fresh model: the grid's best


def test_cli_saves_the_choice_as_the_model_defaults(setup, tmp_path, capsys):
    root, dev, test = setup
    from normlab.diarization.models.weights import sha256

    model = tmp_path / "m.pt"
    model.write_bytes((root / "m.pt").read_bytes())
    tuned = sha256(model)  # the file as tuned: --save rewrites it after
    grid = [a for k, v in {**SEG, **STITCH}.items() for a in ("--grid", f"{k}={','.join(map(str, v))}")]
    assert main(["diarize", "tune", "--dev", str(dev), "--test", f"held={test}", "--model", str(model),
                 "--embedding", str(root / "enc.pt"), "--out", str(tmp_path / "t.json"), "--save", *grid]) == 0
    strict = {"parse_constant": lambda c: pytest.fail(f"t.json holds {c}: not JSON")}  # NaN where no overlap is output
    out = json.loads((tmp_path / "t.json").read_text(), **strict)
    assert out["model_sha256"] == tuned and out["embedding_sha256"] == sha256(root / "enc.pt")  # what was tuned
    printed = capsys.readouterr().out
    assert "held (scored once), chosen: DER" in printed and "of bootstrap resamples of the dev files" in printed
    loaded = EENDModel.load(model)
    cfg = PipelineConfig.for_model(loaded)
    assert {k: getattr(cfg, k) for k in out["readings"]["chosen"]} == out["readings"]["chosen"]
    # --vad speech reads at the settings the dev set chose for it: what the results' vad_speech column states
    assert loaded.postprocess["vad_speech"] == out["readings"]["vad_speech"]
    vad = PipelineConfig.for_model(loaded, vad="speech")
    assert {k: getattr(vad, k) for k in out["readings"]["vad_speech"]} == out["readings"]["vad_speech"]
    assert PipelineConfig.for_model(loaded, threshold=0.45).threshold == 0.45  # the caller still wins
    other = "speech" if out["speakers"] == "eend" else "eend"
    assert PipelineConfig.for_model(loaded, speakers=other).threshold == out["modes"][other]["threshold"]
    assert main(["diarize", "tune", "--dev", str(dev), "--save"]) == 2  # the shipped model is never written
    assert "--model" in capsys.readouterr().err
    assert main(["diarize", "tune", "--dev", str(dev), "--save", "--model", str(SHIPPED)]) == 2  # not even named
    assert "one of normlab's own model files" in capsys.readouterr().err
    model.chmod(0o444)  # a read-only model file was rewritten in place (and came back writable)
    before = model.read_bytes()
    assert main(["diarize", "tune", "--dev", str(dev), "--model", str(model), "--save"]) == 2
    assert "read-only" in capsys.readouterr().err and model.read_bytes() == before


def test_a_folder_without_ref_rttm_reads_all_its_rttm_files(tmp_path):
    """`*.wav` beside one `.rttm` each (the layout `diarize run` writes): every recording, not the first's only."""
    d = _folder(tmp_path, "dev", [1, 2])
    for w in (d / "wav").glob("*.wav"):
        w.rename(d / w.name)
    (d / "wav").rmdir()
    ref = (d / "ref.rttm").read_text().splitlines()
    for uri in ("r1", "r2"):
        (d / f"{uri}.rttm").write_text("\n".join(x for x in ref if f" {uri} " in x) + "\n")
    (d / "ref.rttm").unlink()
    assert sorted(w.stem for w, _ in files_of([d])) == ["r1", "r2"]
    with pytest.raises(ValueError, match="an empty folder name"):
        files_of([d, ""])


def test_another_encoder_is_tried_on_each_modes_choice_its_tie_goes_to_the_lower_cut(setup, monkeypatch):
    """With a second speaker encoder, each mode's choice is segmented again with it at ``ENCODER_GRID``'s pieces
    and clustered at its cuts and floors; of its settings within ``ENCODER_TIE`` of its best the lowest cut is
    stored (two cuts the dev set cannot tell apart: the one that merges fewer people), and it becomes the
    mode's choice only where its best is lower beyond doubt."""
    from normlab.diarization.models.campplus import CAMPlusEncoder
    from normlab.diarization.pipeline import tuning

    root, dev, _ = setup
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    torch.manual_seed(0)
    other = CAMPlusEncoder().eval()  # random weights: the test is about the bookkeeping
    real = tuning.measure
    grid = tuning.ENCODER_GRID["campplus"]
    top, tied = grid["cluster_threshold"][2], grid["cluster_threshold"][1]  # the best, and a cut below it, tied

    def measure_(segs, refs, cfg):
        r = dict(real(segs, refs, cfg))
        if cfg.speaker_encoder == "campplus":
            r["der_0.25"] = {top: 0.1, tied: 0.1 + tuning.ENCODER_TIE / 2}.get(cfg.cluster_threshold, 0.5) + (
                cfg.piece != grid["piece"][-1]) + (cfg.min_cluster != grid["min_cluster"][0])
        return r

    monkeypatch.setattr(tuning, "measure", measure_)
    monkeypatch.setattr(tuning, "share_better", lambda a, b, **k: 0.99)  # CAM++'s best: lower beyond doubt
    seg = {**SEG, "speakers": ("eend",), "vad": ("off",), "threshold": (0.3,)}
    r = tune_pipeline(model, {"ge2e": encoder, "campplus": other}, [dev], segment_grid=seg, stitch_grid=STITCH)
    n = int(np.prod([len(v) for v in grid.values()]))
    assert len(r["grid"]) == 4 + n and sum(g["speaker_encoder"] == "campplus" for g in r["grid"]) == n
    chosen = r["encoders"]["campplus"]["eend"]
    assert (chosen["cluster_threshold"], chosen["piece"], chosen["min_cluster"]) == (tied, grid["piece"][-1],
                                                                                     grid["min_cluster"][0])
    assert r["modes"]["eend"] == chosen and r["encoders"]["ge2e"]["eend"]["speaker_encoder"] == "ge2e"
    assert r["encoder_better_share"] == {"campplus": {"eend": 0.99}}
    monkeypatch.setattr(tuning, "share_better", lambda a, b, **k: 0.9)  # not beyond doubt: GE2E's choice stays
    r = tune_pipeline(model, {"ge2e": encoder, "campplus": other}, [dev], segment_grid=seg, stitch_grid=STITCH)
    assert r["modes"]["eend"] == r["encoders"]["ge2e"]["eend"] and r["encoders"]["campplus"]["eend"] == chosen


def test_an_incumbent_of_another_encoder_is_measured_and_kept_unless_beaten_beyond_doubt(setup, monkeypatch):
    """The grid holds GE2E's settings only, so a model whose stored choice is CAM++'s (as shipped) lost it to the
    grid's best whatever the dev set said: the opposite of the rule every other incumbent follows."""
    from normlab.diarization.models.campplus import CAMPlusEncoder
    from normlab.diarization.pipeline import tuning

    root, dev, _ = setup
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    torch.manual_seed(0)
    encoders = {"ge2e": encoder, "campplus": CAMPlusEncoder().eval()}  # random weights: bookkeeping only
    seg = {**SEG, "speakers": ("eend",), "vad": ("off",), "threshold": (0.3,)}
    monkeypatch.setattr(tuning, "share_better", lambda a, b, **k: 0.9)  # nothing is lower beyond doubt
    first = tune_pipeline(model, encoders, [dev], segment_grid=seg, stitch_grid=STITCH)
    incumbent = {**first["encoders"]["campplus"]["eend"], "cluster_threshold": 0.77}  # in no grid
    r = tune_pipeline(model, encoders, [dev], segment_grid=seg, stitch_grid=STITCH, incumbent={"eend": incumbent})
    assert r["modes"]["eend"] == incumbent
    assert r["incumbent"]["eend"]["kept"] and r["incumbent"]["eend"]["measured"]
    assert sum(g["speaker_encoder"] == "campplus" and g["cluster_threshold"] == 0.77 for g in r["grid"]) == 1
    monkeypatch.setattr(tuning, "share_better", lambda a, b, **k: 0.99)  # the final choice lower beyond doubt
    r = tune_pipeline(model, encoders, [dev], segment_grid=seg, stitch_grid=STITCH, incumbent={"eend": incumbent})
    assert r["modes"]["eend"] != incumbent and not r["incumbent"]["eend"]["kept"]


def test_tuning_scores_the_turns_diarize_writes_up_to_the_audios_end(setup, tmp_path):
    """A file 7.95 s long: its last 100 ms frame reaches 8.0 s. ``diarize`` cut the turns there, the tuning did
    not, and scored the tail as false alarm (tune 30.99% where evaluate read 30.65% with the settings it stored)."""
    from normlab.diarization import diarization_error_rate, diarize
    from normlab.diarization.pipeline.stitch import stitch

    root, _, _ = setup
    audio = tones(7.95)  # speech to the end
    sf.write(tmp_path / "cut.wav", audio, SR)
    ref = [Turn("cut", a, 1.6, f"s{(a // 2) % 2:.0f}") for a in np.arange(0, 8, 2.0)]
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    cfg = PipelineConfig.for_model(model, step=2.0, vad="off")
    with torch.no_grad():
        seg = segment(model, encoder, torch.from_numpy(audio), "cut", cfg)
    assert seg.frames * seg.frame_seconds > 7.95 and max(t.end for t in stitch(seg, cfg)) <= 7.95
    written = diarize(tmp_path / "cut.wav", model=root / "m.pt", embedding=root / "enc.pt", step=2.0, vad="off")
    assert max(t.end for t in written) == pytest.approx(7.95)  # speech to the end: the tail is there to cut
    assert measure({"cut": seg}, {"cut": ref}, cfg)["der_0.25"] == diarization_error_rate(ref, written, collar=0.25).der


def test_tune_refuses_an_out_that_is_one_of_its_inputs(setup, tmp_path, capsys, monkeypatch):
    """`tune --model m.pt --out m.pt --overwrite --save`: the JSON replaced the model, then the save failed with a
    traceback; `--out dev/ref.rttm --overwrite` replaced the dev reference."""
    import shutil

    from normlab.diarization.pipeline import tuning

    root, dev, _ = setup
    model = tmp_path / "m.pt"
    shutil.copy(root / "m.pt", model)
    data = tmp_path / "dev"
    shutil.copytree(dev, data)
    monkeypatch.setattr(tuning, "tune_pipeline", lambda *a, **k: pytest.fail("the grid ran"))
    before = {f: f.read_bytes() for f in (model, data / "ref.rttm", data / "wav" / "r1.wav")}
    for out, what in ((model, "model"), (data / "ref.rttm", "reference"), (data / "wav" / "r1.wav", "audio"),
                      (root / "enc.pt", "speaker encoder's weights")):
        argv = ["diarize", "tune", "--dev", str(data), "--model", str(model), "--embedding", str(root / "enc.pt"),
                "--out", str(out), "--overwrite", "--save"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is the {what} this tuning reads" in err[0], err
    assert all(f.read_bytes() == b for f, b in before.items())


def test_dev_folders_whose_recordings_share_a_name_are_refused(setup, tmp_path, monkeypatch):
    """Results and references are keyed by the recording's name: of two dev folders holding r1 and r2 each, the
    first folder's recordings were silently dropped (6 files counted, 3 scored)."""
    import shutil

    from normlab.diarization.pipeline import tuning, whiten

    root, dev, _ = setup
    shutil.copytree(dev, tmp_path / "again")
    model, encoder = EENDModel.load(root / "m.pt"), SpeakerEncoder.load(root / "enc.pt")
    monkeypatch.setattr(tuning, "segment", lambda *a, **k: pytest.fail("work began before the check"))
    with pytest.raises(UserError, match=r"--dev: two recordings named 'r1' \(.*dev.*r1.wav and .*again.*r1.wav\)"):
        tune_pipeline(model, encoder, [dev, tmp_path / "again"], segment_grid=SEG, stitch_grid=STITCH)
    with pytest.raises(UserError, match="test set t: two recordings named 'r1'"):
        tune_pipeline(model, encoder, [dev], {"t": [dev, tmp_path / "again"]}, segment_grid=SEG, stitch_grid=STITCH)
    with pytest.raises(UserError, match="--train: two recordings named 'r1'"):
        whiten.fit_files(model, encoder, [dev, tmp_path / "again"])
    monkeypatch.chdir(dev.parent)  # one folder named twice (its path, and relative): once, as tune counts it
    with pytest.raises(UserError) as named_twice:  # (this tiny model's window then refuses its default step)
        whiten.fit_files(model, encoder, [dev, pathlib.Path(".") / dev.name])
    assert "two recordings" not in str(named_twice.value)


def test_a_speaker_with_only_zero_length_turns_is_not_counted(monkeypatch):
    """The speaker count right as evaluate and pyannote count it: a speaker whose turns all last 0 s is none."""
    import normlab.diarization.pipeline.tuning as tuning

    monkeypatch.setattr(tuning, "stitch", lambda seg, cfg: seg)  # the "segmentation" is the hypothesis itself
    refs = {"b": [Turn("b", 0.0, 5.0, "A"), Turn("b", 1.0, 0.0, "B")]}
    hyp = {"b": [Turn("b", 0.0, 5.0, "x")]}
    assert measure(hyp, refs, PipelineConfig())["count_right"] == 1.0
    hyp = {"b": [Turn("b", 0.0, 5.0, "x"), Turn("b", 2.0, 0.0, "y")]}
    assert measure(hyp, refs, PipelineConfig())["count_right"] == 1.0
