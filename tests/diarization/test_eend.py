"""EEND model, post-processing to turns, and the training loop with resume."""
import pathlib

import pytest
import torch

from normlab.diarization.io.rttm import Turn
from normlab.diarization.models.eend import EENDModel, ModelConfig
from normlab.diarization.pipeline.postprocess import fill_gaps, hold, median_filter, to_turns
from normlab.diarization.training.train import TrainConfig, train

DEBUG = ModelConfig(input_dim=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.1)


def toy_batches(gen: torch.Generator):
    """Learnable toy data: speaker k is active where feature k is positive."""
    feats = torch.randn(4, 30, 8, generator=gen)
    labels = (feats[..., :2] > 0).float()
    mask = torch.zeros(4, 30, dtype=torch.bool)
    mask[0, 25:] = True
    return feats, labels, mask


def test_median_filter_and_turns():
    active = torch.tensor([[0, 1], [1, 1], [0, 1], [1, 0], [1, 0], [1, 0], [0, 0]], dtype=torch.uint8)
    assert median_filter(active, 3)[:, 0].tolist() == [0, 0, 1, 1, 1, 1, 0]  # the 1-frame blip at t=1 is gone
    probs = torch.tensor([[0.9, 0.1]] * 3 + [[0.2, 0.8]] * 4 + [[0.1, 0.1]] * 2)
    turns = to_turns(probs, 0.1, "rec", median=1)
    assert turns == [Turn("rec", 0.0, pytest.approx(0.3), "spk0"),
                     Turn("rec", pytest.approx(0.3), pytest.approx(0.4), "spk1")]
    with pytest.raises(ValueError, match="odd"):
        median_filter(active, 4)


def test_fill_gaps_bridges_a_speakers_short_pauses_only():
    col = [1, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0]  # pauses of 2 and 3 frames, then 2 to the end
    active = torch.tensor([col, [0] * 11], dtype=torch.uint8).T  # T, 2: the second speaker silent
    out = fill_gaps(active, 3)
    assert out[:, 0].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0]  # 2 < 3 filled; 3 kept; the end never
    assert out[:, 1].tolist() == [0] * 11  # a speaker's pause needs that speaker on both sides
    lead = torch.tensor([[0, 0, 1, 0, 1]], dtype=torch.uint8).T
    assert fill_gaps(lead, 3)[:, 0].tolist() == [0, 0, 1, 1, 1]  # the start is not a pause
    assert torch.equal(fill_gaps(active, 0), active) and torch.equal(fill_gaps(active, 1), active)
    assert active[:, 0].tolist() == col  # the input is not changed


def test_an_exclusive_fill_never_adds_overlap():
    """In ``speech`` mode (one speaker at a time) a fill of A's pause around a short turn of B made 3.2 s of
    two-speaker overlap; only the pause's frames nobody else holds are filled."""
    a = [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    b = [0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1]  # a short turn inside A's pause; then a short pause of its own
    active = torch.tensor([a, b], dtype=torch.uint8).T
    out = fill_gaps(active, 4, exclusive=True)
    assert out[:, 0].tolist() == [1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0]  # B's frame stays B's alone
    assert out[:, 1].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1]
    assert int((out.sum(1) > 1).sum()) == 0
    assert fill_gaps(active, 4)[:, 0].tolist() == [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]  # eend mode: as before


def test_runs_and_turns_read_any_nonzero_frame_and_refuse_a_bad_frame_length():
    """``runs`` cast its mask to int8: 0.5 read as 0, 255 as -1 (an inverted run); ``to_turns`` took a frame
    length of 0 (zero-length turns) or below (negative durations)."""
    from normlab.diarization.pipeline.postprocess import runs

    assert runs(torch.tensor([0, 0.5, 0.7, 0])) == [(1, 3)]
    assert runs(torch.tensor([0, 255, 255, 0], dtype=torch.uint8)) == [(1, 3)]
    assert runs(torch.tensor([0, 256, 0])) == [(1, 2)]
    for bad in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="frame_seconds"):
            to_turns(torch.ones(3, 1), bad, "u", median=1)
    with pytest.raises(ValueError, match="1 labels for 2 speakers"):
        to_turns(torch.ones(3, 2), 0.1, "u", median=1, labels=["a"])


def test_hold_carries_a_turn_through_silence_while_it_stays_likely():
    """Hysteresis at 0.2: speaker 0's turn (frames 0-2) holds on through 3-5 (0.3), stops at 6 (0.1); 8-9 are above
    0.2 but touch none of its turns. On 11-13 speaker 1 talks (the count said so, though its probability is low):
    speaker 0's run there, likelier, is not added (no new overlap). Frame 15 is silent and reached by both
    speakers' runs: the likelier (speaker 1) takes it."""
    p0 = [0.9, 0.9, 0.9, 0.3, 0.3, 0.3, 0.1, 0.1, 0.3, 0.3, 0.1, 0.3, 0.3, 0.3, 0.9, 0.3, 0.1]
    p1 = [0.0] * 11 + [0.1, 0.1, 0.1, 0.0, 0.4, 0.9]
    a0 = [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]
    a1 = [0] * 11 + [1, 1, 1, 0, 0, 1]
    probs, active = torch.tensor([p0, p1]).T, torch.tensor([a0, a1], dtype=torch.uint8).T
    out = hold(active, probs, 0.2)
    assert out[:, 0].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]
    assert out[:, 1].tolist() == [0] * 11 + [1, 1, 1, 0, 1, 1]
    assert torch.equal(hold(active, probs, 1.0), active)  # nothing is above 1: off
    assert active[:, 0].tolist() == a0  # the input is not changed
    assert hold(active[:0], probs[:0], 0.2).shape == (0, 2)


def test_model_shapes_padding_and_save_load(tmp_path):
    torch.manual_seed(0)
    for enc in ("transformer", "conformer"):
        m = EENDModel(ModelConfig(**{**DEBUG.__dict__, "encoder": enc})).eval()
        x = torch.randn(2, 12, 8)
        mask = torch.zeros(2, 12, dtype=torch.bool)
        mask[1, 9:] = True
        y = m(x, mask)
        assert y.shape == (2, 12, 2)
        torch.testing.assert_close(y[1:, :9], m(x[1:, :9]), rtol=1e-5, atol=1e-5)
        m.save(tmp_path / f"{enc}.pt")
        torch.testing.assert_close(EENDModel.load(tmp_path / f"{enc}.pt")(x, mask), y)
    with pytest.raises(ValueError, match="encoder"):
        EENDModel(ModelConfig(encoder="lstm"))


def test_a_model_built_from_a_path_points_to_load():
    """EENDModel("model.pt") failed with AttributeError: 'str' object has no attribute 'encoder'."""
    with pytest.raises(TypeError, match=r"^EENDModel takes a ModelConfig, got str \(a saved model loads with "
                                        r"EENDModel.load\(path\)\)$"):
        EENDModel("model.pt")
    with pytest.raises(TypeError, match=r"^EENDModel takes a ModelConfig, got dict$"):
        EENDModel({"d_model": 64})


def test_the_model_of_a_diverged_training_says_so_when_loaded(tmp_path):
    """`tune --model` (and diarize) took a diverged training's model as any other: DER 100%, without a word."""
    import warnings

    from normlab.diarization.training import provenance

    path = tmp_path / "model.pt"
    EENDModel(DEBUG).save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EENDModel.load(path)  # a model of a training that finished: nothing said
    with pytest.raises(ValueError, match=r"is a folder, not a model file \(give .*model.pt, the one in it\)$"):
        EENDModel.load(tmp_path)  # it read "no model file at" the folder
    provenance.write(path, {"diverged": {"step": 7, "loss": float("nan"), "grad_norm": float("inf")}})
    with pytest.warns(UserWarning, match=r"model.pt: the training that made it diverged at step 7; it holds the "
                                         r"weights of step 6"):
        EENDModel.load(path)


@pytest.mark.parametrize("table, value", [("modes", {"eend": "x"}), ("vad_speech", "x"), ("whitened", [1]),
                                          ("vbx", {"eend": 3}), ("encoders", {"ge2e": "x"}), (None, "x")])
def test_a_model_file_whose_stored_settings_are_damaged_is_one_line(tmp_path, table, value):
    """A settings table holding text (or a list) where its settings go was read only when a run asked for it
    (--vad speech, --whiten, --clustering vbx, --speaker-encoder), an AttributeError traceback there."""
    path = tmp_path / "model.pt"
    model = EENDModel(DEBUG)
    model.save(path)
    blob = torch.load(path, weights_only=True)
    if table is None:
        blob["postprocess"] = value
    else:
        blob["postprocess"][table] = value
    torch.save(blob, path)
    said = "are not a table of settings" if table is None else f"hold a '{table}' that is not a table of settings"
    with pytest.raises(ValueError, match=f"model.pt is not a normlab EEND model.*: its stored pipeline settings "
                                         f"{said}$"):
        EENDModel.load(path)


def test_training_loss_falls(tmp_path):
    torch.manual_seed(0)
    m = EENDModel(DEBUG)
    losses = train(m, toy_batches, TrainConfig(steps=60, lr=3e-3, warmup=10, ckpt_every=20), tmp_path)
    assert len(losses) == 60
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the GPU's dropout stream is checked where there is one"))])
def test_resume_after_a_kill_ends_bitwise_where_an_uninterrupted_run_ends(tmp_path, device):
    """(On CUDA the dropout masks come from the device's own random stream, which the checkpoint did not keep.)"""
    cfg = TrainConfig(steps=12, lr=3e-3, warmup=4, ckpt_every=4)
    torch.manual_seed(1)
    straight = EENDModel(DEBUG).to(device)
    init = {k: v.clone() for k, v in straight.state_dict().items()}
    full = train(straight, toy_batches, cfg, tmp_path / "a")
    killed = EENDModel(DEBUG).to(device)
    killed.load_state_dict(init)
    train(killed, toy_batches, TrainConfig(**{**cfg.__dict__, "steps": 8}), tmp_path / "b")  # "killed" at step 8
    if device == "cuda":  # a new process's device stream: not where the killed one left it
        torch.cuda.manual_seed_all(12345)
    resumed = EENDModel(DEBUG).to(device)  # a new process: fresh model, state comes from the checkpoint
    losses = train(resumed, toy_batches, cfg, tmp_path / "b")
    assert losses == full
    for k, v in straight.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k


@pytest.mark.parametrize("content", [b"junk\n", b"", None])
def test_a_checkpoint_that_is_not_one_is_one_clear_error_and_stays(tmp_path, content):
    """A truncated or foreign OUT/ckpt/last.pt raised UnpicklingError with a traceback: now one error naming
    the file, which is left as it is (the user decides)."""
    (tmp_path / "ckpt").mkdir()
    last = tmp_path / "ckpt" / "last.pt"
    if content is None:
        torch.save({"not": "a checkpoint"}, last)
    else:
        last.write_bytes(content)
    before = last.read_bytes()
    with pytest.raises(ValueError, match="last.pt is not a (readable|normlab) training checkpoint"):
        train(EENDModel(DEBUG), toy_batches, TrainConfig(steps=2, warmup=1), tmp_path / "ckpt")
    assert last.read_bytes() == before


@pytest.mark.parametrize("change, why", [
    ({"model": {}}, r"its model, optimizer or random state does not load: RuntimeError: Error\(s\) in loading"),
    ({"optimizer": {"x": 1}}, "its model, optimizer or random state does not load: KeyError"),
    ({"step": -5}, "its step is -5, not a whole number >= 0"),
    ({"step": 1.5}, "its step is 1.5, not a whole number >= 0"),
    ({"losses": "x"}, "its losses are not a list of numbers"),
    ({"losses": [0.5]}, "it records 1 losses for its 2 steps"),
])
def test_a_damaged_checkpoint_is_one_clear_error_and_stays(tmp_path, change, why):
    """A checkpoint whose weights do not load raised load_state_dict's RuntimeError with a traceback; one with a
    negative step trained on with a negative learning rate."""
    train(EENDModel(DEBUG), toy_batches, TrainConfig(steps=2, warmup=1), tmp_path)
    last = tmp_path / "last.pt"
    torch.save({**torch.load(last, weights_only=False), **change}, last)
    before = last.read_bytes()
    with pytest.raises(ValueError, match=rf"last.pt is not a checkpoint normlab can resume \({why}.*\): move it "
                                         "away to start over") as e:
        train(EENDModel(DEBUG), toy_batches, TrainConfig(steps=3, warmup=1), tmp_path)
    assert "\n" not in str(e.value) and last.read_bytes() == before


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_writes_checkpoints_and_metrics(tmp_path, monkeypatch, rank):
    """One rank of two (the process group faked: DDP is the bare model, the loss mean is the rank's own):
    rank 0 writes the checkpoint and metrics.csv into the folder it made, every other rank writes nothing."""
    import normlab.diarization.training.train as training

    monkeypatch.setattr(training, "world", lambda: (rank, 2))
    monkeypatch.setattr(training, "mean_over_ranks", lambda value, world: value)
    monkeypatch.setattr(training, "_same_checkpoint", lambda *args: None)  # (a collective: no group here)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda model, device_ids=None: model)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()  # as rank 0 makes it for everyone
    called = []
    torch.manual_seed(0)
    losses = train(EENDModel(DEBUG), toy_batches, TrainConfig(steps=4, warmup=1, ckpt_every=2), ckpt,
                   lambda step, total, loss: called.append(step))
    assert len(losses) == 4
    written = sorted(p.name for p in ckpt.iterdir())
    if rank == 0:
        assert written == ["last.pt", "metrics.csv"] and called == [1, 2, 3, 4]
    else:
        assert written == [] and called == []


@pytest.mark.parametrize("bad, message", [
    ({"ckpt_every": 0}, "ckpt_every must be a whole number >= 1, got 0"),  # was ZeroDivisionError in train
    ({"steps": 0}, "steps must be a whole number >= 1, got 0"),  # was an untrained model.pt
    ({"steps": 2.5}, "steps must be a whole number >= 1, got 2.5"),
    ({"warmup": -1}, "warmup must be a whole number >= 0, got -1"),
    ({"lr": -1.0}, "lr must be a number in (0, 1000], got -1.0"),  # was left to torch's Adam
    ({"lr": float("nan")}, "lr must be a number in (0, 1000], got nan"),
    ({"lr": float("inf")}, "lr must be a number in (0, 1000], got inf"),
    ({"lr": 1e38}, "lr must be a number in (0, 1000], got 1e+38"),  # Adam's state overflowed: a traceback
    ({"lr": "0.1"}, "lr must be a number in (0, 1000], got '0.1'"),
    ({"clip": 0.0}, "clip must be a finite number > 0, got 0.0"),
    ({"clip": float("nan")}, "clip must be a finite number > 0, got nan"),
    ({"restart_lr": -1.0}, "restart_lr must be a number in (0, 1000], got -1.0"),
])
def test_train_config_refuses_settings_that_cannot_train(bad, message):
    from normlab import UserError

    with pytest.raises(UserError) as e:
        TrainConfig(**{"steps": 10, "warmup": 2, **bad})
    assert str(e.value) == message


@pytest.mark.parametrize("bad, message", [({"batch": 0}, "batch must be a whole number >= 1, got 0"),
                                          ({"frames": -3}, "frames must be a whole number >= 1, got -3")])
def test_train_run_refuses_an_empty_batch_before_reading_data(tmp_path, bad, message):
    from normlab import UserError
    from normlab.diarization.training.train import train_run

    with pytest.raises(UserError, match=message):
        train_run(tmp_path / "no such data", tmp_path / "out", DEBUG, TrainConfig(steps=2, warmup=1), **bad)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad, message", [
    ({"d_model": 0}, "d_model must be a whole number >= 1, got 0"),  # built, then failed deep in attention
    ({"n_speakers": 0}, "n_speakers must be a whole number >= 1, got 0"),
    ({"n_heads": 0}, "n_heads must be a whole number >= 1, got 0"),
    ({"d_model": 18, "n_heads": 4}, "d_model 18 is not divisible by n_heads 4"),
    ({"n_layers": 0}, "n_layers must be a whole number >= 1, got 0"),
    ({"d_ff": 0}, "d_ff must be a whole number >= 1, got 0"),
    ({"input_dim": 0}, "input_dim must be a whole number >= 1, got 0"),
    ({"d_model": 16.0}, "d_model must be a whole number >= 1, got 16.0"),
    ({"dropout": 1.0}, "dropout must be a number in [0, 1), got 1.0"),
    ({"dropout": -0.1}, "dropout must be a number in [0, 1), got -0.1"),
    ({"dropout": float("nan")}, "dropout must be a number in [0, 1), got nan"),
    ({"attn_dropout": 1.5}, "attn_dropout must be a number in [0, 1), got 1.5"),
])
def test_model_config_refuses_a_model_that_cannot_be_built(bad, message):
    from normlab import UserError

    with pytest.raises(UserError) as e:
        ModelConfig(**{**DEBUG.__dict__, **bad})  # at once, before any model is built
    assert str(e.value) == message


def test_a_shipped_model_goes_by_its_name(tmp_path, monkeypatch, capsys):
    """The docs' ``--model assets/eend_local4.pt`` named a file only the repository holds (and not at that
    path): from an installed package it read "no model file", and nothing said where the shipped models are."""
    from normlab.cli import main
    from normlab.diarization.models.eend import SHIPPED, model_path, shipped_models

    monkeypatch.chdir(tmp_path)
    own = SHIPPED.parent / "eend_local4.pt"
    assert {"eend_real", "eend_local4", "eend_pre_ln"} <= set(shipped_models())
    for name in ("eend_local4", "eend_local4.pt", "assets/eend_local4.pt"):
        assert model_path(name) == own
    assert EENDModel.load("eend_local4").cfg.n_speakers == 4
    with pytest.raises(FileNotFoundError, match=r"no model file at nosuch \(the models shipped with normlab go by "
                                                r"name: .*eend_local4.*\)$"):
        EENDModel.load("nosuch")
    assert model_path("other/eend_local4.pt") == pathlib.Path("other/eend_local4.pt")  # a path, not a name
    (tmp_path / "eend_local4.pt").write_text("mine")  # a file of that name here is the one meant
    with pytest.raises(ValueError, match="eend_local4.pt is not a normlab EEND model file"):
        EENDModel.load("eend_local4.pt")
    (tmp_path / "eend_local4.pt").unlink()
    (tmp_path / "dev").mkdir()
    assert main(["diarize", "tune", "--model", "eend_local4", "--save", "--dev", "dev"]) == 2  # never rewritten
    assert "one of normlab's own model files" in capsys.readouterr().err
