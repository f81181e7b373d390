"""Sounds that are not speech: the sounds, a pause opened in a conversation, recordings of sounds alone, the
recipe's last stage that learns from them."""
import pathlib
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab.diarization.data import nonspeech
from normlab.diarization.data.simulate import SimConfig, simulate
from normlab.diarization.io.rttm import Turn

SR = 8000
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")


@pytest.mark.parametrize("kind", [k for k in nonspeech.KINDS if k != "music"])
def test_each_sound_has_unit_power_and_its_own_shape(kind):
    x = nonspeech.sound(kind, 4 * SR, np.random.default_rng(0), SR)
    assert x.shape == (4 * SR,) and x.dtype == np.float32 and np.isfinite(x).all()
    assert np.mean(x.astype(np.float64) ** 2) == pytest.approx(1.0, rel=1e-3)
    spectrum = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(x.size, 1 / SR)
    if kind == "hum":  # its power sits on the mains frequency's harmonics
        mains = [f for f in (50.0, 60.0) if spectrum[np.abs(freqs - f) < 1].sum() > 0.01 * spectrum.sum()]
        assert len(mains) == 1
    if kind == "typing":  # clicks: a few loud samples over a quiet floor
        assert np.max(np.abs(x)) > 8 * np.median(np.abs(x))
    if kind == "brown":
        assert spectrum[freqs < 200].sum() > spectrum[freqs > 1000].sum()


def test_an_unknown_sound_is_one_clear_error():
    with pytest.raises(ValueError, match="sound must be one of"):
        nonspeech.sound("thunder", 100, np.random.default_rng(0), SR)


def test_a_pause_opens_where_nobody_speaks_and_moves_the_later_turns():
    turns = [Turn("r", 0.5, 1.0, "A"), Turn("r", 2.0, 1.0, "B"), Turn("r", 2.5, 1.5, "A"), Turn("r", 5.0, 1.0, "B")]
    tracks = [np.ones(7 * SR, np.float32), np.full(7 * SR, 2.0, np.float32)]
    for seed in range(8):
        out, moved, (a, b) = nonspeech.insert_stretch(tracks, turns, SR, np.random.default_rng(seed))
        length = (b - a) / SR
        assert nonspeech.STRETCH[0] <= length <= nonspeech.STRETCH[1]
        assert all(x.size == 7 * SR + (b - a) for x in out)
        assert all(np.all(x[a:b] == 0) for x in out) and np.all(out[1][b:] == 2.0)
        for old, new in zip(turns, moved):  # before the pause nothing moves, after it everything by its length
            assert new.duration == old.duration and new.speaker == old.speaker
            before = old.start * SR < a
            assert new.start == (old.start if before else pytest.approx(old.start + length, abs=1e-3))
            assert new.start + new.duration <= a / SR + 1e-9 or new.start >= b / SR - 1e-3  # nobody in it
        assert a / SR in (1.5, 4.0, 6.0, 7.0)  # the end of a stretch of speech, or of the recording


def test_a_sound_fills_the_pause_below_the_speech():
    rng = np.random.default_rng(1)
    speech = np.zeros(20 * SR, np.float32)
    speech[: 5 * SR] = rng.standard_normal(5 * SR)
    out = nonspeech.add_sound(speech, (8 * SR, 14 * SR), SR, rng)
    assert np.all(out[: 7 * SR] == speech[: 7 * SR]) and np.all(out[15 * SR :] == 0)
    inside = float(np.mean(out[9 * SR : 13 * SR].astype(np.float64) ** 2))
    ratio_db = 10 * np.log10(np.mean(speech.astype(np.float64) ** 2) / inside)
    assert nonspeech.STRETCH_SNR_DB[0] - 1 < ratio_db < nonspeech.STRETCH_SNR_DB[1] + 1


def test_recordings_of_sounds_alone_have_an_empty_reference(tmp_path):
    from normlab.diarization.data.dataset import MixtureSet

    folder = simulate(tmp_path / "n", SimConfig(n_mixtures=3, style="nonspeech", split="train"))
    wavs = sorted((folder / "wav").glob("*.wav"))
    assert [w.stem for w in wavs] == [f"train_nonspeech_0_{i:05d}" for i in range(3)]
    for w in wavs:
        x, sr = sf.read(w)
        assert sr == SR and nonspeech.ALONE_SECONDS[0] <= x.size / sr <= nonspeech.ALONE_SECONDS[1]
        assert np.sqrt(np.mean(x**2)) > 10 ** (nonspeech.ALONE_DBFS[0] / 20) / 2
    assert (folder / "ref.rttm").read_text().strip() == ""
    data = MixtureSet(folder, n_speakers=4)
    assert all(labels.sum() == 0 and labels.shape[1] == 4 for _, labels in data.items)


def test_the_cli_simulates_sounds_alone_and_names_a_bad_pause(tmp_path, capsys):
    from normlab.cli import main

    assert main(["diarize", "simulate", "--out", str(tmp_path / "s"), "--style", "nonspeech", "--n-mixtures", "1"]) == 0
    assert (tmp_path / "s" / "wav" / "train_nonspeech_0_00000.wav").is_file()
    assert main(["diarize", "simulate", "--out", str(tmp_path / "t"), "--stretch-p", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stretch_p" in err[0]


def test_a_pause_is_only_for_conversations():
    with pytest.raises(ValueError, match="stretch_p"):
        SimConfig(style="mixture", stretch_p=0.5)
    with pytest.raises(ValueError, match="stretch_p"):
        SimConfig(style="conversation", stretch_p=1.5)


@pytest.mark.parametrize("kw", [{"rt60": (0.2, 0.3)}, {"augment": True}])
def test_sounds_alone_refuse_what_shapes_voices(kw):
    """--rt60 and --augment with style nonspeech wrote the same audio as without, and config.json recorded them."""
    with pytest.raises(ValueError, match="style 'nonspeech' writes its sounds as they are"):
        SimConfig(style="nonspeech", **kw)
    SimConfig(style="nonspeech")


@needs_espeak
def test_a_conversation_with_a_pause_is_the_same_conversation_moved(tmp_path):
    """The pause draws from its own random stream: with a pause, the speakers and their turns are those of the
    conversation without it, the later ones moved by the pause; where the draw gives no pause, the recording is
    the one without pauses, bit for bit."""
    from dataclasses import replace

    from normlab.diarization.data.simulate import conversation
    from normlab.diarization.data.voices import voices

    base = SimConfig(n_speakers=3, min_speakers=2, split="train", sources="espeak", style="conversation",
                     augment=True, beta_by_count=True, seed=4)
    pool = voices("train", "espeak")
    half = replace(base, stretch_p=0.5)  # at seed 4: index 2 draws a pause, index 3 none
    a, ta, _ = conversation(base, 2, pool)
    b, tb, _ = conversation(half, 2, pool)
    shift = (b.size - a.size) / SR
    assert nonspeech.STRETCH[0] <= shift <= nonspeech.STRETCH[1]
    assert [(t.speaker, t.duration) for t in ta] == [(t.speaker, t.duration) for t in tb]
    moves = {round(y.start - x.start, 2) for x, y in zip(ta, tb)}
    assert moves <= {0.0, round(shift, 2)}
    a, ta, _ = conversation(base, 3, pool)
    b, tb, _ = conversation(half, 3, pool)
    assert np.array_equal(a, b)  # the same audio and turns (the uri names the setting)
    assert [(t.start, t.duration, t.speaker) for t in ta] == [(t.start, t.duration, t.speaker) for t in tb]


@needs_espeak
def test_the_last_stage_learns_from_the_sounds_and_resumes(tmp_path, monkeypatch):
    from normlab.diarization.data.dataset import MixtureSet
    from normlab.diarization.training import recipe
    from normlab.diarization.training.recipe import (
        LAST_STAGE,
        RecipeConfig,
        _splits,
        finetune_model,
        simulate_splits,
        train_model,
    )
    from normlab.diarization.training.train import read_checkpoint

    read = []  # the folders each stage reads

    def recording(folders, *args, **kwargs):
        read.append(sorted(pathlib.Path(f).name for f in (folders if isinstance(folders, list) else [folders])))
        return MixtureSet(folders, *args, **kwargs)

    monkeypatch.setattr(recipe, "MixtureSet", recording)

    torch.set_num_threads(1)
    cfg = RecipeConfig(n_train=2, n_train_real=0, n_train_synth=0, n_train_stretch=1, n_train_nonspeech=1,
                       steps=3, finetune_steps=2, warmup=2, batch=2, d_model=16, n_layers=1, n_heads=2,
                       min_utterances=2, max_utterances=3, sources="espeak")
    names = [n for n, _ in _splits(cfg) if n.startswith("train")]
    assert set(LAST_STAGE) <= set(names)
    data = simulate_splits(tmp_path / "data", cfg, which="train")
    assert MixtureSet(data / "train_stretch", 4).items and MixtureSet(data / "train_nonspeech", 4).items
    out = tmp_path / "out"
    model, losses = train_model(data, out, cfg)
    assert len(losses) == 3 and read_checkpoint(out / "ckpt" / "last.pt")["step"] == 3
    assert read == [["train"]]  # the sounds wait for the last stage
    first = {k: v.clone() for k, v in model.state_dict().items()}
    model, losses = finetune_model(data, out, cfg, model)
    assert len(losses) == 2 and read_checkpoint(out / "ckpt_finetune" / "last.pt")["step"] == 2
    assert read[-1] == ["train", "train_nonspeech", "train_stretch"]
    assert any(not torch.equal(first[k], v) for k, v in model.state_dict().items())
    again, _ = finetune_model(data, out, cfg, train_model(data, out, cfg)[0])  # both stages done: resumed
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
