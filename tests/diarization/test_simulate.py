"""Simulation with espeak-ng, the dataset, and the simulate/train commands."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab.cli import main
from normlab.diarization.data.dataset import MixtureSet, frame_labels
from normlab.diarization.data.simulate import SimConfig, simulate, variants
from normlab.diarization.io.rttm import Turn, read_rttm
from normlab.diarization.io.uem import read_uem
from normlab.diarization.models.eend import EENDModel
from normlab.diarization.training import provenance as model_provenance

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (make install does)")
SMALL = dict(n_mixtures=2, min_utterances=3, max_utterances=4)


def test_splits_use_disjoint_voices():
    train, dev, test = variants("train"), variants("dev"), variants("test")
    assert len(train) > 40 and len(dev) > 20 and len(test) > 20
    assert not set(train) & set(test) and not set(train) & set(dev) and not set(dev) & set(test)
    with pytest.raises(ValueError, match="split"):
        variants("eval")


def test_simulation_is_reproducible_and_labels_match_audio(tmp_path):
    a = simulate(tmp_path / "a", SimConfig(**SMALL))
    b = simulate(tmp_path / "b", SimConfig(**SMALL))
    assert (a / "ref.rttm").read_text() == (b / "ref.rttm").read_text()
    wav = sorted((a / "wav").glob("*.wav"))[0]
    audio, sr = sf.read(wav)
    assert sr == 8000 and np.array_equal(audio, sf.read(sorted((b / "wav").glob("*.wav"))[0])[0])
    ref = read_rttm(a / "ref.rttm")
    assert len(ref) == 2 and all(len({t.speaker for t in ts}) == 2 for ts in ref.values())
    assert read_uem(a / "all.uem")[wav.stem][0][1] == pytest.approx(len(audio) / sr, abs=1e-3)
    turns = ref[wav.stem]
    speech = np.zeros(len(audio), bool)
    for t in turns:
        speech[int(t.start * sr) : int(t.end * sr)] = True
    assert np.mean(audio[speech] ** 2) > 10 * np.mean(audio[~speech] ** 2)  # labelled speech carries the energy
    test = simulate(tmp_path / "t", SimConfig(**SMALL, split="test"))
    with pytest.raises(ValueError, match="holds mixtures simulated with split='test' .now 'train'"):
        simulate(tmp_path / "t", SimConfig(**SMALL))  # its ref.rttm would describe other audio than wav/ holds
    assert sorted((test / "wav").glob("*.wav")) == sorted(test.glob("wav/test*.wav"))
    train_spk = {t.speaker.split(".")[1] for ts in ref.values() for t in ts}
    test_spk = {t.speaker.split(".")[1] for ts in read_rttm(test / "ref.rttm").values() for t in ts}
    assert not train_spk & test_spk


def test_a_folder_of_someone_elses_data_is_not_simulated_into(tmp_path):
    """A folder with a ref.rttm (or wav/ files) but no config.json of normlab's is someone's data: its reference
    would be replaced and new recordings mixed into it. Refused before anything is written; a folder normlab
    simulated into (killed or finished) resumes."""
    theirs = tmp_path / "theirs"
    (theirs / "wav").mkdir(parents=True)
    (theirs / "ref.rttm").write_text("mine\n")
    cfg = SimConfig(n_mixtures=1, n_speakers=2, style="mixture", sources="espeak")
    with pytest.raises(ValueError, match="was not simulated by normlab"):
        simulate(theirs, cfg)
    assert (theirs / "ref.rttm").read_text() == "mine\n" and not (theirs / "config.json").exists()
    (theirs / "ref.rttm").unlink()
    (theirs / "wav" / "x.wav").write_bytes(b"")
    with pytest.raises(ValueError, match="was not simulated by normlab"):
        simulate(theirs, cfg)
    # a config.json of the user's own is no mark of normlab's: it and the reference beside it were replaced
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text('{"lr": 0.1}\n')
    (own / "ref.rttm").write_text("mine\n")
    with pytest.raises(ValueError, match="was not simulated by normlab"):
        simulate(own, cfg)
    assert (own / "config.json").read_text() == '{"lr": 0.1}\n' and (own / "ref.rttm").read_text() == "mine\n"
    (own / "wav").mkdir()
    (own / "wav" / "take1.wav").write_bytes(b"")
    (own / "config.json").write_text('{"seed": 42}\n')  # not read as settings normlab's mixtures were made with
    with pytest.raises(ValueError, match="was not simulated by normlab"):
        simulate(own, cfg)


def test_simulate_train_and_recipe_refuse_an_empty_path(capsys, tmp_path, monkeypatch):
    """An empty --out (or --data) meant the current folder: simulate wrote config.json, ref.rttm and wav/ there."""
    from normlab.cli import main

    monkeypatch.chdir(tmp_path)  # where a regression would write

    for argv in (["diarize", "simulate", "--out", ""], ["diarize", "train", "--data", "", "--out", "x"],
                 ["diarize", "train", "--data", "d", "--out", " "], ["diarize", "recipe", "--out", ""]):
        assert main(argv) == 2 and "expected a path, got an empty one" in capsys.readouterr().err, argv
    assert not any(tmp_path.iterdir())


def test_a_rerun_with_fewer_mixtures_is_refused(tmp_path):
    """With --n-mixtures 2 after 4, ref.rttm listed 2 mixtures while training and scoring read all 4 WAVs (two
    scored against an empty reference)."""
    out = simulate(tmp_path / "s", SimConfig(**{**SMALL, "n_mixtures": 3}))
    before = (out / "ref.rttm").read_text()
    with pytest.raises(ValueError, match="holds 1 recording beyond the 2 asked for"):
        simulate(out, SimConfig(**SMALL))
    assert (out / "ref.rttm").read_text() == before
    assert len(read_rttm(simulate(out, SimConfig(**{**SMALL, "n_mixtures": 3})) / "ref.rttm")) == 3


def test_a_rerun_keeps_a_reference_the_user_changed(tmp_path):
    """A turn set right in ref.rttm (or a narrower all.uem) was written over by the next run, without a word."""
    out = simulate(tmp_path / "s", SimConfig(**{**SMALL, "n_mixtures": 1}))
    for name, edit in (("ref.rttm", "SPEAKER x 1 0.000 1.000 <NA> <NA> mine <NA> <NA>\n"), ("all.uem", "x 1 0 5\n")):
        kept = (out / name).read_text()
        (out / name).write_text(kept + edit)
        with pytest.raises(ValueError, match=f"{name} was changed since normlab wrote it"):
            simulate(out, SimConfig(**{**SMALL, "n_mixtures": 2}))
        assert (out / name).read_text() == kept + edit
        (out / name).write_text(kept)
    assert len(read_rttm(simulate(out, SimConfig(**{**SMALL, "n_mixtures": 2})) / "ref.rttm")) == 2


def test_a_folder_of_an_earlier_version_keeps_the_defaults_it_was_made_with(tmp_path):
    """Its config.json has no key for a setting added since (duration): it ran at that setting's default, so a
    resume at the default goes on and one with another value is refused (it grew the folder unrefused)."""
    out = simulate(tmp_path / "s", SimConfig(**{**SMALL, "n_mixtures": 1}))
    settings = json.loads((out / "config.json").read_text())
    del settings["duration"]
    (out / "config.json").write_text(json.dumps(settings))
    simulate(out, SimConfig(**{**SMALL, "n_mixtures": 2}))
    with pytest.raises(ValueError, match="simulated with rt60=None"):
        simulate(out, SimConfig(**{**SMALL, "n_mixtures": 3, "rt60": (0.2, 0.4)}))
    settings = json.loads((out / "config.json").read_text())
    del settings["rt60"]  # a setting missing from the file counts as its default, not as anything
    (out / "config.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="simulated with rt60=None"):
        simulate(out, SimConfig(**{**SMALL, "n_mixtures": 3, "rt60": (0.2, 0.4)}))


def test_a_rerun_with_other_voices_installed_is_refused(tmp_path):
    """A synthesizer installed (or removed) between a run and its resumption changed the pool: the rest of the
    mixtures drew from another pool, and config.json named only the new one."""
    out = simulate(tmp_path / "s", SimConfig(**SMALL))
    settings = json.loads((out / "config.json").read_text())
    settings["voices"] = settings["voices"][1:]  # the first run had one voice fewer
    (out / "config.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="simulated from other voices than this machine has now \\(with 1 "):
        simulate(out, SimConfig(**{**SMALL, "n_mixtures": 3}))
    assert len(list((out / "wav").glob("*.wav"))) == 2


def test_frame_labels():
    y = frame_labels([Turn("a", 0.0, 0.25, "x"), Turn("a", 0.2, 0.2, "y")], ["x", "y"], 5, 0.1)
    assert y[:, 0].tolist() == [1, 1, 0, 0, 0] and y[:, 1].tolist() == [0, 0, 1, 1, 0]


def test_dataset_batches_and_cli_train(tmp_path, capsys):
    assert main(["diarize", "simulate", "--out", str(tmp_path / "sim"), "--n-mixtures", "2", "--min-utterances", "3",
                 "--max-utterances", "4"]) == 0
    data = MixtureSet(tmp_path / "sim")
    feats, labels, mask = data.batches(batch=3, frames=80)(torch.Generator().manual_seed(0))
    assert feats.shape == (3, 80, 345) and labels.shape == (3, 80, 2) and mask.shape == (3, 80)
    assert labels.sum() > 0
    with pytest.warns(UserWarning, match="2 of 2 mixtures have more than 1 speakers"):
        MixtureSet(tmp_path / "sim", n_speakers=1)  # the second speaker would be labelled silence, unsaid
    with pytest.raises(ValueError, match="frames=100000 is longer than every mixture"):
        data.batches(batch=1, frames=100000)  # all padding, at attention's quadratic cost: it seemed to hang
    args = ["diarize", "train", "--data", str(tmp_path / "sim"), "--out", str(tmp_path / "model"), "--steps", "6",
            "--d-model", "32", "--n-layers", "1", "--frames", "80", "--batch", "2", "--ckpt-every", "3",
            "--warmup", "2"]
    (tmp_path / "model" / "ckpt").mkdir(parents=True)
    dead = 2**22 + 12345  # above the usual pid limit: no process has it
    (tmp_path / "model" / "ckpt" / f"last.{dead}.tmp").write_bytes(b"half a checkpoint of a killed run")
    assert main(args) == 0
    assert (tmp_path / "model" / "model.pt").exists() and (tmp_path / "model" / "ckpt" / "last.pt").exists()
    assert not list((tmp_path / "model" / "ckpt").glob("*.tmp"))  # a killed write's leftover is removed
    made = model_provenance.read(tmp_path / "model" / "model.pt")
    assert EENDModel.load(tmp_path / "model" / "model.pt") and made["window_seconds"] == 8.0
    # the voices it heard, with their packages and licences, as the recipe's models record them
    assert made["train_sources"]["voices"] and "espeak-ng" in made["train_sources"]["licences"]
    # settings stored since (tune --save) were for the weights before: the rewrite said it, not without a word
    model_provenance.write_pipeline(tmp_path / "model" / "model.pt", {"eend": {"threshold": 0.4}}, "eend", {})
    with pytest.warns(RuntimeWarning, match="pipeline settings of `diarize tune --save` stored in the one it "
                                            "replaces were for the weights before"):
        assert main(args[:7] + ["8"] + args[8:]) == 0  # resumes at step 6, runs 2 more
    assert "trained 8 steps" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no wav"):
        MixtureSet(tmp_path / "model")


def test_room_impulse_response_decays_60_db_over_rt60():
    from normlab.diarization.data.simulate import reverberate, room_impulse_response

    rng = np.random.default_rng(0)
    h = room_impulse_response(0.4, 8000, rng)
    assert h.size == 3200 and np.sum(h**2) == pytest.approx(1.0, rel=1e-5)
    head, tail = np.sqrt(np.mean(h[1:400] ** 2)), np.sqrt(np.mean(h[-400:] ** 2))
    assert 20 * np.log10(head / tail) > 40
    x = rng.standard_normal(4000).astype(np.float32)
    assert reverberate(x, 0.3, 8000, rng).shape == x.shape
    with pytest.raises(ValueError, match="rt60"):
        room_impulse_response(0.0, 8000, rng)


def test_reverberation_changes_audio_not_turns():
    from normlab.diarization.data.simulate import mixture

    dry = SimConfig(**SMALL)
    wet = SimConfig(**SMALL, rt60=(0.3, 0.6))
    voices = variants("train")
    a, turns_a, uri_a = mixture(dry, 0, voices)
    b, turns_b, uri_b = mixture(wet, 0, voices)
    assert [(t.start, t.duration, t.speaker) for t in turns_a] == [(t.start, t.duration, t.speaker) for t in turns_b]
    assert uri_a != uri_b and a.shape == b.shape and not np.allclose(a, b)


@pytest.mark.skipif(shutil.which("flite") is None, reason="flite not installed")
def test_flite_split_is_another_synthesizer(tmp_path):
    assert variants("flite") == ["awb", "kal16", "rms", "slt"]
    out = simulate(tmp_path / "f", SimConfig(**SMALL, split="flite"))
    speakers = {t.speaker.split(".")[1] for ts in read_rttm(out / "ref.rttm").values() for t in ts}
    assert speakers <= set(variants("flite")) and len(speakers) >= 2
    assert all(p.name.startswith("flite_") for p in (out / "wav").glob("*.wav"))


def _windows_by_speakers(folder):
    from normlab.diarization.metrics.windows import crop, spans, speaker_counts

    refs = {}
    for uri, turns in read_rttm(folder / "ref.rttm").items():
        end = max(t.end for t in turns)
        for k, (s, e) in enumerate(spans(int(end * 10) + 1, 100)):
            refs[f"{uri}_w{k}"] = crop(turns, uri, s / 10, e / 10)
    return speaker_counts(refs)


def test_mixtures_and_windows_hold_1_to_4_speakers(tmp_path):
    cfg = SimConfig(n_mixtures=4, n_speakers=4, min_speakers=1, beta=0.5, min_utterances=3, max_utterances=4)
    out = simulate(tmp_path / "s", cfg)
    ref = read_rttm(out / "ref.rttm")
    assert sorted(len({t.speaker for t in ts}) for ts in ref.values()) == [1, 2, 3, 4]  # one mixture per count
    windows = _windows_by_speakers(out)  # the model's 10 s windows
    assert {1, 2, 3, 4} <= set(windows)
    with pytest.raises(ValueError, match="min_speakers"):
        SimConfig(n_speakers=2, min_speakers=3)


def test_more_speakers_more_silence_with_beta_by_count():
    from normlab.diarization.data.simulate import BETA_SCALE

    a = SimConfig(n_speakers=4, min_speakers=1, beta_by_count=True)
    assert [a.speakers_of(i) for i in range(5)] == [1, 2, 3, 4, 1]
    assert [2 * BETA_SCALE[k] for k in (1, 2, 3, 4)] == [2, 2, 5, 9]  # EEND-EDA's simulation


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox not installed (make system-deps)")
def test_augmentation_changes_audio_not_turns():
    from dataclasses import replace

    from normlab.diarization.data.simulate import mixture
    from normlab.diarization.data.voices import voices

    plain = SimConfig(n_mixtures=4, n_speakers=4, min_speakers=1, min_utterances=2, max_utterances=3,
                      split="test", sources="all", beta_by_count=True)
    pool = voices("test", "all")
    for i in (1, 3):  # 2 and 4 speakers
        a, turns_a, uri_a = mixture(plain, i, pool)
        b, turns_b, uri_b = mixture(replace(plain, augment=True), i, pool)
        timing = [(t.start, t.duration, t.speaker) for t in turns_a]
        assert timing == [(t.start, t.duration, t.speaker) for t in turns_b]
        assert uri_a != uri_b and "_aug" in uri_b and a.shape == b.shape
        assert np.corrcoef(a, b)[0, 1] < 0.9  # warped, levelled, other noise, maybe a room or a telephone
        assert np.abs(b).max() <= 10 ** (-1 / 20) + 1e-6  # the random level peaks at -24..-1 dBFS


def test_cli_simulate_with_recorded_voices_and_perturbations(tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["diarize", "simulate", "--out", str(out), "--n-mixtures", "2", "--n-speakers", "2",
                 "--min-speakers", "1",
                 "--sources", "all", "--augment", "--beta-by-count", "--min-utterances", "2", "--max-utterances", "2",
                 "--jobs", "1"]) == 0
    ref = read_rttm(out / "ref.rttm")
    assert sorted(len({t.speaker for t in ts}) for ts in ref.values()) == [1, 2]
    assert all("_all_aug_bk_" in uri for uri in ref)
    assert "wrote 2 mixtures" in capsys.readouterr().out


@pytest.mark.parametrize("kw,message", [({"min_utterances": 5, "max_utterances": 2}, "min_utterances"),
                                        ({"beta": -1.0}, "beta"), ({"beta": float("nan")}, "beta"),
                                        ({"rt60": (0.5, 0.1)}, "rt60"), ({"rt60": (-1.0, 0.1)}, "rt60"),
                                        ({"n_mixtures": 10**20}, "n_mixtures"), ({"n_mixtures": -1}, "n_mixtures")])
def test_inconsistent_ranges_are_refused_before_any_mixture(kw, message):
    """numpy raised "low >= high" or "scale < 0" from inside a worker; and a negative rt60 was reported with
    a randomly drawn value: now the settings themselves are refused, naming what was given. A count beyond any
    disk listed every name in memory (gigabytes, no output) before the first mixture."""
    with pytest.raises(ValueError, match=message):
        SimConfig(**{"n_mixtures": 1, **kw})


def test_a_refused_simulation_leaves_a_folder_the_corrected_one_can_use(tmp_path):
    """Too many speakers for the split was found after config.json was written, so the corrected command was
    refused ("holds mixtures simulated with n_speakers=100") on a folder without a single mixture."""
    out = tmp_path / "s"
    with pytest.raises(ValueError, match="100 speakers asked"):
        simulate(out, SimConfig(**{**SMALL, "n_speakers": 100}))
    assert not (out / "config.json").exists() and not (out / "wav").exists()
    (out / "wav").mkdir(parents=True, exist_ok=True)
    killed = {**dataclasses.asdict(SimConfig(**SMALL)), "n_speakers": 7}  # a run killed before its first mixture
    (out / "config.json").write_text(json.dumps(killed) + "\n")
    assert (simulate(out, SimConfig(**SMALL)) / "ref.rttm").is_file()


@pytest.mark.parametrize("field, value", [("rt60", (0.0, 1e9)), ("rt60", (0.2, 11.0)), ("max_utterances", 100000),
                                          ("rt60", (0.0001, 0.0001)), ("rt60", (0.0, 0.0))])
def test_absurd_rooms_and_lengths_are_one_line(field, value):
    """An RT60 of 1e9 s asked for a 39 TiB impulse response (out of memory); 100,000 utterances ran for ever; an
    RT60 of 0.1 ms made an empty impulse response (an IndexError inside a worker)."""
    with pytest.raises(ValueError, match=field):
        SimConfig(**{**SMALL, field: value})


def test_a_diverged_training_is_a_result_not_nan_weights(tmp_path, capsys):
    """With a huge learning rate the loss was NaN from step 2 and training ran on to the end, writing a model of
    NaN weights and exiting 0 ("final loss nan"); the pipeline refused the file only later."""
    from normlab.diarization.training.train import read_checkpoint

    assert main(["diarize", "simulate", "--out", str(tmp_path / "sim"), "--n-mixtures", "2", "--min-utterances", "3",
                 "--max-utterances", "4"]) == 0
    out = tmp_path / "run"
    args = ["diarize", "train", "--data", str(tmp_path / "sim"), "--out", str(out), "--steps", "30", "--d-model", "16",
            "--n-layers", "2", "--frames", "50", "--batch", "2", "--warmup", "0", "--lr", "1000", "--norm", "none"]
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "diverged at step" in err[0]
    state = read_checkpoint(out / "ckpt" / "last.pt")
    step = state["diverged"]["step"]
    assert 1 <= step < 30 and state["step"] == step - 1 and len(state["losses"]) == step - 1
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    meta = model_provenance.read(out / "model.pt")
    assert meta["diverged"]["step"] == step and meta["steps"] == step - 1
    csv = (out / "ckpt" / "metrics.csv").read_text().splitlines()
    assert csv[-1].startswith(f"{step},") and ("nan" in csv[-1].lower() or "inf" in csv[-1].lower())
    assert main(args) == 1  # the same command again: the same result, no training, the mark kept
    assert f"diverged at step {step}" in capsys.readouterr().err
    assert (out / "ckpt" / "metrics.csv").read_text().splitlines() == csv


def test_a_kill_inside_a_wav_write_is_simulated_again(tmp_path, monkeypatch):
    """Each WAV was written to its final name, whose presence marks a finished mixture: a kill inside the write
    left half a file that the rerun kept (half the audio, the reference's turns past its end)."""
    cfg = SimConfig(**{**SMALL, "n_mixtures": 3})
    clean = simulate(tmp_path / "clean", cfg)
    real_write, calls = sf.write, []

    def killed_in_the_second(path, audio, *args, **kw):
        calls.append(path)
        if len(calls) == 2:  # half the samples reach the disk, then the process dies
            real_write(path, audio[: len(audio) // 2], *args, **kw)
            raise KeyboardInterrupt
        return real_write(path, audio, *args, **kw)

    monkeypatch.setattr(sf, "write", killed_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        simulate(tmp_path / "killed", cfg)
    monkeypatch.setattr(sf, "write", real_write)
    again = simulate(tmp_path / "killed", cfg)
    for name in ("ref.rttm", "all.uem"):
        assert (again / name).read_text() == (clean / name).read_text()
    wavs = sorted(p.name for p in (clean / "wav").iterdir())
    assert sorted(p.name for p in (again / "wav").iterdir()) == wavs
    for name in wavs:
        assert (again / "wav" / name).read_bytes() == (clean / "wav" / name).read_bytes()


def test_a_simulation_records_the_versions_that_made_it_and_training_reads_them(tmp_path, monkeypatch):
    """config.json held settings and voices only: a model trained on another machine (or where dpkg is missing)
    recorded that machine's package versions, or none, as those of its training audio. made_with.json is written
    before the first recording and kept: a rerun after an upgrade neither rewrites it nor changes the data digest
    a training resume compares."""
    from normlab import __version__
    from normlab.diarization.training import provenance
    from normlab.diarization.training.train import data_digest

    out = simulate(tmp_path / "s", SimConfig(**{**SMALL, "n_mixtures": 1}))
    made = json.loads((out / "made_with.json").read_text())
    assert made["versions"]["normlab"] == __version__ and made["packages"]["espeak-ng"]
    made["packages"]["espeak-ng"] = "0.0-as-made"  # as if made on another machine
    (out / "made_with.json").write_text(json.dumps(made))
    simulate(out, SimConfig(**{**SMALL, "n_mixtures": 2}))  # grown here: the record stays
    assert provenance.folder_sources([out])["packages"]["espeak-ng"] == "0.0-as-made"
    digest = data_digest([out])
    monkeypatch.setattr(provenance, "versions", lambda: {"normlab": "upgraded since"})
    simulate(out, SimConfig(**{**SMALL, "n_mixtures": 2}))  # the recipe's rerun after an upgrade
    assert data_digest([out]) == digest  # (the resume was refused: "trained with other settings (data_digest")
    old = tmp_path / "old"  # audio of an unknown making (an earlier version's folder) gets no record
    shutil.copytree(out, old)
    (old / "made_with.json").unlink()
    simulate(old, SimConfig(**{**SMALL, "n_mixtures": 3}))
    assert not (old / "made_with.json").exists()


def test_voices_of_another_version_never_stop_a_finished_training(tmp_path):
    """The model file's sources were looked up after training: a voice this version does not know (data of
    another version) or a null list raised there, every rerun, and model.pt was never written."""
    import json

    from normlab.diarization.training.provenance import folder_sources

    for i, voices in enumerate([["recorded.nobody", "espeak-ng.Adam"], ["neural.zzz"], None, "espeak-ng.Adam"]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "config.json").write_text(json.dumps({"voices": voices}))
    made = folder_sources([tmp_path / str(i) for i in range(4)])
    assert made["voices"] == ["espeak-ng.Adam"] and made["unknown"] == ["neural.zzz", "recorded.nobody"]
    assert "espeak-ng" in made["licences"]


def test_simulate_reports_progress_counted_from_zero(tmp_path):
    """Progress callbacks take ``i`` counted from 0 (the bar adds 1): simulate passed the count done, so its bar
    read 2 of 3 after the first mixture, closed with one to go and printed "simulate: 4/3" in a log."""
    seen = []
    out = simulate(tmp_path / "s", SimConfig(**{**SMALL, "n_mixtures": 3}), progress=lambda i, n, uri: seen.append(i))
    assert seen == [0, 1, 2]
    next(iter(sorted((out / "wav").glob("*.wav")))).unlink()  # a run killed before its first mixture was written
    seen.clear()
    simulate(out, SimConfig(**{**SMALL, "n_mixtures": 3}), progress=lambda i, n, uri: seen.append(i))
    assert seen == [2]  # the third mixture of three, the two others already there


@pytest.mark.skipif(shutil.which("flite") is None, reason="flite not installed")
@pytest.mark.parametrize("style", ["mixture", "conversation"])
def test_flite_split_with_augmentation_draws_its_babble_from_its_own_voices(style, monkeypatch):
    """Babble took its talkers from espeak-ng voices (or real persons) only; flite's split has neither: about
    a third of its augmented mixtures and conversations failed with a numpy traceback."""
    from normlab.diarization.data import augment, conversation
    from normlab.diarization.data import simulate as sim

    cfg = SimConfig(**{**SMALL, "n_mixtures": 1}, split="flite", augment=True, style=style)
    monkeypatch.setattr(augment, "NOISES", ("babble",) * len(augment.NOISES))  # babble every time
    monkeypatch.setattr(conversation, "NOISE_KINDS", ("babble",) * len(conversation.NOISE_KINDS))
    make = sim.mixture if style == "mixture" else sim.conversation
    audio, turns, _ = make(cfg, 0, sim.voices(cfg.split, cfg.sources))
    assert turns and np.isfinite(audio).all() and np.abs(audio).max() > 0


def test_no_turn_ends_past_its_file():
    """Start and duration were rounded to milliseconds apart: a turn could end up to 1 ms past the audio (a
    last turn at 16.013 + 2.147 = 18.160 s in a file of 18.159 s)."""
    from normlab.diarization.data import simulate as sim

    cfg = SimConfig(n_mixtures=8, min_speakers=1, n_speakers=4, seed=3, beta=2.0, min_utterances=3, max_utterances=4)
    pool = sim.voices(cfg.split, cfg.sources)
    for i in range(cfg.n_mixtures):  # (a conversation ends in silence: its last turn never reached the end)
        audio, turns, _ = sim.mixture(cfg, i, pool)
        assert max(t.start + t.duration for t in turns) <= len(audio) / cfg.sample_rate + 1e-9, i


def test_a_finished_folder_simulated_again_is_left_as_it_is(tmp_path, monkeypatch):
    """The same settings on a finished folder rewrote config.json, ref.rttm, all.uem and the list of what normlab
    wrote: read-only, it failed naming a temporary file (".config.json.7059.tmp: Operation not permitted")."""
    import pathlib

    from normlab import written

    out = simulate(tmp_path / "s", SimConfig(**SMALL))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def refused(*a, **k):
        raise PermissionError(1, "Operation not permitted")

    real_write_text = pathlib.Path.write_text
    monkeypatch.setattr(written, "replace_whole", refused)
    monkeypatch.setattr(written, "record", refused)
    monkeypatch.setattr(pathlib.Path, "write_text", lambda self, *a, **k: refused() if self.parent == out
                        else real_write_text(self, *a, **k))
    assert simulate(out, SimConfig(**SMALL)) == out
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
