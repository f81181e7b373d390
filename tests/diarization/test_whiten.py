"""The speaker embeddings' whitening (``pipeline/whiten.py``, ``normlab diarize whiten``): learned from the
pieces of one speaker in training conversations, it shrinks the directions one voice wanders in, travels in
the model file, and the pipeline uses it only where asked (``whiten``) and the file holds one."""
import json

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab import UserError
from normlab.cli import main
from normlab.diarization.io.rttm import Turn, write_rttm
from normlab.diarization.models.eend import EENDModel
from normlab.diarization.pipeline import whiten
from normlab.diarization.pipeline.cluster import cluster
from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.segment import Segmentation
from normlab.diarization.pipeline.tuning import STITCH_GRID, WHITENED_GRID, keep_incumbent, parse_grid
from normlab.diarization.training.provenance import write_whitening
from tiny_diarizer import SR, tiny_models

DIM, PIECE = 8, 10  # embedding dimensions; frames per piece (0.1 s frames)


def _voices(rng, n_pieces: int, means: np.ndarray, wander: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Pieces' embeddings and speakers: each speaker's mean plus a large wander along dimension 0 (what is said)
    and a small one elsewhere."""
    who = np.arange(n_pieces) % len(means)
    noise = 0.03 * rng.standard_normal((n_pieces, DIM))
    noise[:, 0] = wander * rng.standard_normal(n_pieces)
    return means[who] + noise, who


def _recording(emb: np.ndarray, who: np.ndarray, uri: str = "r") -> tuple[Segmentation, list[Turn]]:
    """One window; piece i is speaker who[i] alone over frames [10 i, 10 i + 10)."""
    n = len(who)
    probs = torch.zeros(1, n * PIECE, int(who.max()) + 1)
    for i, s in enumerate(who):
        probs[0, i * PIECE : (i + 1) * PIECE, s] = 0.9
    pieces = [(0, int(s), i * PIECE, (i + 1) * PIECE, i) for i, s in enumerate(who)]
    ref = [Turn(uri, i * PIECE * 0.1, PIECE * 0.1, f"spk{s}") for i, s in enumerate(who)]
    e = torch.from_numpy(emb).float()
    return Segmentation(uri, n * PIECE, 0.1, [0], probs, pieces, e / e.norm(dim=1, keepdim=True),
                        np.ones(n)), ref


def _means(rng, k: int) -> np.ndarray:
    """Speakers who differ a little, off dimension 0, around a common voice."""
    m = np.zeros((k, DIM))
    m[:, 1] = 3.0
    m[:, 2:] = 0.25 * rng.standard_normal((k, DIM - 2))
    return m


def test_whitening_separates_voices_that_differ_less_than_one_voice_wanders():
    rng = np.random.default_rng(0)
    train = [_recording(*_voices(rng, 40, _means(rng, 3)), uri=f"t{i}") for i in range(10)]
    fitted = whiten.fit(train, threshold=0.5, lam=0.01)
    assert fitted["speakers"] == 30 and fitted["pieces"] == 400 and fitted["recordings"] == 10
    means = _means(np.random.default_rng(7), 2)
    emb, who = _voices(np.random.default_rng(8), 40, means)
    seg, _ = _recording(emb, who)
    raw = cluster(seg.embeddings.numpy(), threshold=0.3, num_speakers=2)
    mapped = whiten.apply(seg.embeddings, fitted["matrix"])
    white = cluster(mapped.numpy(), threshold=0.3, num_speakers=2)
    agree = lambda labels: max(np.mean(labels == who), np.mean(labels != who))  # noqa: E731
    assert agree(white) == 1.0 and agree(raw) < 0.8  # the wander along dimension 0 hid the two voices
    assert torch.allclose(mapped.norm(dim=1), torch.ones(len(who)))
    # lam large: the map is the identity up to scale, the embeddings as they were
    big = whiten.fit(train, threshold=0.5, lam=1e6)["matrix"]
    assert torch.allclose(whiten.apply(seg.embeddings, big), seg.embeddings, atol=1e-5)


def test_only_pieces_of_one_voice_teach_the_map():
    rng = np.random.default_rng(1)
    seg, ref = _recording(*_voices(rng, 6, _means(rng, 2)))
    assert whiten.piece_speakers(seg, ref, 0.5) == {i: f"spk{i % 2}" for i in range(6)}
    # piece 0 now half its speaker, half the other one talking alone: not one voice
    ref = [t if t.start > 0 else Turn("r", 0.0, 0.5, "spk0") for t in ref] + [Turn("r", 0.5, 0.5, "spk1")]
    assert 0 not in whiten.piece_speakers(seg, ref, 0.5) and len(whiten.piece_speakers(seg, ref, 0.5)) == 5
    with pytest.raises(UserError, match="nothing to fit"):
        whiten.fit([_recording(*_voices(rng, 2, _means(rng, 2)))], threshold=0.5)  # one piece per speaker
    with pytest.raises(UserError, match="lam"):
        whiten.fit([(seg, ref)], threshold=0.5, lam=0.0)
    with pytest.raises(UserError, match="another speaker encoder"):
        whiten.apply(seg.embeddings, torch.eye(DIM + 1))


def test_grid_and_incumbent_know_the_whiten_axis():
    _, st = parse_grid(["whiten=true,false"], ({}, STITCH_GRID))
    assert st["whiten"] == (True, False)
    with pytest.raises(UserError, match="grid"):
        parse_grid(["whiten=maybe"], ({}, STITCH_GRID))
    # an incumbent stored before the axis existed ran without whitening: it is compared at whiten=False
    files = {f"f{i}": (1.0, 10.0) for i in range(5)}
    rows = [{"speakers": "eend", "whiten": w, "_files": files} for w in (False, True)]
    kept = keep_incumbent(rows, {"eend": {"speakers": "eend", "whiten": True}}, {"eend": {"speakers": "eend"}},
                          ("speakers", "whiten"))
    assert kept["eend"]["settings"] == {"speakers": "eend", "whiten": False} and kept["eend"]["kept"]


def _folder(root, seeds):
    (root / "wav").mkdir(parents=True)
    turns = []
    for seed in seeds:
        t = np.arange(8 * SR) / SR
        audio = np.where((t % 4) < 2, np.sin(2 * np.pi * (200 + 30 * seed) * t), np.sin(2 * np.pi * 900 * t))
        sf.write(root / "wav" / f"r{seed}.wav", (0.3 * audio * ((t % 2) < 1.6)).astype(np.float32), SR)
        turns += [Turn(f"r{seed}", a, 1.6, f"s{(a // 2) % 2:.0f}") for a in np.arange(0, 8, 2.0)]
    write_rttm(turns, root / "ref.rttm")
    return root


def test_the_model_file_carries_it_and_the_pipeline_asks_for_it(tmp_path, capsys):
    tiny_models(tmp_path, 3.0, window=4.0, step=2.0, median=1, vad="off", piece=1.0)  # all speakers on
    model_path = tmp_path / "m.pt"
    with pytest.raises(UserError, match="no embedding whitening"):
        PipelineConfig.for_model(EENDModel.load(model_path), whiten=True)
    train = _folder(tmp_path / "train", [1, 2])
    argv = ["diarize", "whiten", str(model_path), "--train", str(train), "--embedding", str(tmp_path / "enc.pt")]
    assert main(argv) == 0
    model = EENDModel.load(model_path)
    assert model.whitening["recordings"] == 2 and model.whitening["folders"] == {"train": 2}
    assert model.whitening["matrix"].shape == (256, 256) and "versions" in model.whitening
    assert not PipelineConfig.for_model(model).whiten
    write_whitening(model_path, {**model.whitening, "lam": 2.0})  # rewritten in place, the rest kept
    assert EENDModel.load(model_path).whitening["lam"] == 2.0
    # whitened embeddings need their own cut: --whiten asks for the settings the dev set chose with them
    enc = ["--embedding", str(tmp_path / "enc.pt")]
    run = ["diarize", "run", str(train / "wav" / "r1.wav"), "--model", str(model_path), *enc, "--out",
           str(tmp_path / "out")]
    assert main([*run, "--no-whiten"]) == 0
    assert main([*run, "--whiten"]) != 0 and "settings chosen with its whitening" in capsys.readouterr().err
    # and the PLDA model beside it, for VBx, which also starts from its own cut
    assert model.whitening["plda"]["transform"].shape == (256, 256)
    assert main([*run, "--clustering", "vbx"]) != 0 and "settings chosen for VBx" in capsys.readouterr().err
    grid = [f"--grid={g}" for g in ("speakers=eend", "vad=off", "threshold=0.5", "step=2.0", "piece=1.0",
                                    "cluster_threshold=0.1,0.9", "min_cluster=0.0", "weighting=mean",
                                    "overlap_threshold=0.5")]  # raw embeddings only: whitened at WHITENED_GRID
    assert main(["diarize", "tune", "--dev", str(_folder(tmp_path / "dev", [3, 4])), "--model", str(model_path),
                 *enc, "--out", str(tmp_path / "t.json"), "--save", *grid]) == 0
    record = json.loads((tmp_path / "t.json").read_text())  # what made it, as every artifact: versions, command
    assert record["provenance"]["torch"] and record["command"]["dev"] == [str(tmp_path / "dev")]
    assert record["command"]["embedding"] == str(tmp_path / "enc.pt") and record["command"]["save"] is True
    model = EENDModel.load(model_path)
    alt = model.postprocess["whitened"]["eend"]
    assert alt["whiten"] and alt["cluster_threshold"] in WHITENED_GRID["cluster_threshold"]
    cfg = PipelineConfig.for_model(model, whiten=True)
    assert cfg.whiten and cfg.cluster_threshold == alt["cluster_threshold"]
    assert main([*run, "--whiten"]) == 0
    assert model.postprocess["vbx"]["eend"]["clustering"] == "vbx" and main([*run, "--clustering", "vbx"]) == 0
    assert main(["diarize", "whiten", str(tmp_path / "nope.pt"), "--train", str(tmp_path / "none")]) != 0
    assert "no such folder" in capsys.readouterr().err
    # a fit on one speaker gives no PLDA model: it never silently drops the file's own
    one = _folder(tmp_path / "one", [5])
    (one / "ref.rttm").write_text((one / "ref.rttm").read_text().replace(" s1 ", " s0 "))
    assert main(["diarize", "whiten", str(model_path), "--train", str(one), *enc]) == 2
    assert "would remove" in capsys.readouterr().err
    assert EENDModel.load(model_path).whitening["plda"]["transform"].shape == (256, 256)


def test_whiten_brings_the_cut_chosen_with_it(tmp_path):
    """The stored choice clusters raw embeddings at its cut; --whiten takes the settings chosen with whitened
    ones (another cut), and a cut the caller gives wins over both."""
    tiny_models(tmp_path, 3.0)
    model = EENDModel.load(tmp_path / "m.pt")
    model.whitening = {"matrix": torch.eye(256)}
    model.postprocess.update(speakers="eend", modes={"eend": {"speakers": "eend", "cluster_threshold": 0.35}},
                             whitened={"eend": {"speakers": "eend", "cluster_threshold": 0.25, "whiten": True}})
    assert PipelineConfig.for_model(model).cluster_threshold == 0.35
    assert PipelineConfig.for_model(model, whiten=True).cluster_threshold == 0.25
    assert PipelineConfig.for_model(model, whiten=True, cluster_threshold=0.3).cluster_threshold == 0.3
    with pytest.raises(UserError, match="speech-mode settings chosen with its whitening"):
        PipelineConfig.for_model(model, whiten=True, speakers="speech")


def test_whiten_fits_on_ge2e_pieces_where_the_mode_chose_campplus(tmp_path, capsys):
    """The whitening and the PLDA model are GE2E's, but the fit took the eend mode's stored settings: with CAM++
    chosen there (as in the shipped model) `diarize whiten` stopped, "speaker_encoder 'campplus': not among the
    encoders given"."""
    from normlab.diarization.training.provenance import write_pipeline

    tiny_models(tmp_path, 3.0, window=4.0, step=2.0, median=1, vad="off", piece=1.0)
    model_path = tmp_path / "m.pt"
    campplus = {"speakers": "eend", "vad": "off", "speaker_encoder": "campplus", "piece": 3.0, "cluster_threshold": 0.6}
    ge2e = {**campplus, "speaker_encoder": "ge2e", "piece": 1.0, "cluster_threshold": 0.35}
    write_pipeline(model_path, {"eend": campplus}, "eend", {}, encoders={"ge2e": {"eend": ge2e}})
    argv = ["diarize", "whiten", str(model_path), "--train", str(_folder(tmp_path / "train", [1, 2])),
            "--embedding", str(tmp_path / "enc.pt")]
    assert main(argv) == 0, capsys.readouterr().err
    model = EENDModel.load(model_path)
    assert model.whitening["recordings"] == 2 and model.postprocess["modes"]["eend"] == campplus
    blob = torch.load(model_path, weights_only=True)  # no settings chosen with GE2E at all: its pieces still
    blob["postprocess"].pop("encoders")
    torch.save(blob, model_path)
    assert main(argv) == 0, capsys.readouterr().err


def test_the_fit_reports_progress_counted_from_zero(tmp_path):
    """Progress callbacks take ``i`` counted from 0 (the bar adds 1): the fit passed the count done, so its
    bar read 2 of 2 after the first recording and opened a second bar at the end."""
    from normlab.diarization.models.embed import SpeakerEncoder
    from normlab.diarization.pipeline.whiten import fit_files

    tiny_models(tmp_path, 3.0, window=4.0, step=2.0, median=1, vad="off", piece=1.0)
    seen = []
    fit_files(EENDModel.load(tmp_path / "m.pt"), SpeakerEncoder.load(tmp_path / "enc.pt"),
              [_folder(tmp_path / "train", [1, 2])], progress=lambda i, n, label: seen.append((i, n)))
    assert seen == [(1, 2)]  # one block of 50 recordings holds both: the last of 2 is number 1 from 0


@pytest.mark.parametrize("name", ["eend_local4.pt", "eend_real.pt"])
def test_the_package_s_own_model_files_are_never_rewritten(tmp_path, capsys, name):
    """``whiten`` refused the shipped model but rewrote the other model files in the package (the README names
    eend_local4.pt for --model), so an installed package no longer matched itself; the API refuses them too."""
    from normlab.diarization.models.weights import ASSETS
    from normlab.diarization.training.provenance import write_pipeline

    path = ASSETS / name
    before = path.read_bytes()
    (tmp_path / "d").mkdir()
    assert main(["diarize", "whiten", str(path), "--train", str(tmp_path / "d")]) == 2
    assert "one of normlab's own model files" in capsys.readouterr().err
    assert main(["diarize", "tune", "--model", str(path), "--dev", str(tmp_path / "d"), "--save"]) == 2
    assert "one of normlab's own model files" in capsys.readouterr().err
    with pytest.raises(UserError, match="own model files"):
        write_whitening(path, {})
    with pytest.raises(UserError, match="own model files"):
        write_pipeline(path, {}, "eend", {})
    assert path.read_bytes() == before


def test_identical_pieces_or_an_infinite_ridge_are_one_line_not_a_linalg_error():
    """Each speaker's pieces one embedding (no within-speaker spread): the whitening divided 0 by 0 and the PLDA
    fit failed in eigh ("not positive definite"); ``lam=inf`` passed the check and failed the same way."""
    from normlab.diarization.pipeline import vbx

    probs = torch.full((1, 40, 1), 0.9)
    pieces = [(0, 0, a, a + 10, i) for i, a in enumerate(range(0, 40, 10))]
    a, b = np.eye(8)[0], np.eye(8)[1]
    seg = Segmentation("u", 40, 0.1, [0], probs, pieces, torch.tensor(np.stack([a, a, b, b])).float(), np.ones(4))
    ref = [Turn("u", 0.0, 2.0, "A"), Turn("u", 2.0, 2.0, "B")]
    with pytest.raises(ValueError, match="no within-speaker spread to fit the whitening"):
        whiten.fit([(seg, ref)], 0.5)
    with pytest.raises(ValueError, match="no within-speaker spread to fit the PLDA model"):
        vbx.fit_groups([np.stack([a, a]), np.stack([b, b])])
    seg.embeddings = torch.tensor(np.random.default_rng(0).normal(size=(4, 8))).float()
    with pytest.raises(ValueError, match="lam must be a finite number > 0, got inf"):
        whiten.fit([(seg, ref)], 0.5, lam=float("inf"))


def test_a_save_stopped_midway_leaves_the_model_and_no_temporary(tmp_path, monkeypatch):
    """An interrupt inside the save of a model file's new settings left ``m.pipeline.tmp`` (or ``.whitening.tmp``)
    beside the intact model."""
    from normlab.diarization.training import provenance

    model_path, _ = tiny_models(tmp_path, 1.0)
    before = model_path.read_bytes()
    real = torch.save

    def stopped(obj, f, *a, **k):
        real(obj, f, *a, **k)  # the temporary is written whole; the stop comes before it is moved into place
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", stopped)
    for write in (lambda: write_whitening(model_path, {}), lambda: provenance.write(model_path, {"x": 1}),
                  lambda: provenance.write_pipeline(model_path, {}, "eend", {})):
        with pytest.raises(KeyboardInterrupt):
            write()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["enc.pt", "m.pt"]
        assert model_path.read_bytes() == before


def test_a_save_into_a_model_named_by_a_link_writes_the_model_it_names(tmp_path):
    """``tune --save`` or ``whiten`` on a link to a model replaced the link with a file, and left the model the
    link named as it was."""
    model_path, _ = tiny_models(tmp_path, 1.0)
    link = tmp_path / "current.pt"
    link.symlink_to(model_path.name)
    write_whitening(link, {"lam": 3.0})
    assert link.is_symlink() and EENDModel.load(model_path).whitening["lam"] == 3.0


def test_whiten_on_a_model_without_a_whitening_says_it_has_none():
    """With the default speaker encoder it read "the model file's whitening and PLDA model were fitted on GE2E
    embeddings", of a model file holding neither."""
    from normlab.diarization.models.eend import EENDModel, ModelConfig
    from normlab.diarization.pipeline.config import PipelineConfig

    model = EENDModel(ModelConfig(d_model=16, n_layers=1, n_heads=4, d_ff=32))
    with pytest.raises(ValueError, match="the model file holds no embedding whitening"):
        PipelineConfig.for_model(model, whiten=True, speaker_encoder="campplus")
