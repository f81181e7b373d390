"""Data-parallel training (gloo, 2 local processes), devices, metrics.csv, resume across world sizes."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import signal
import socket

import pytest
import torch
import torch.multiprocessing as tmp_mp

from normlab import devices, tracking
from normlab.diarization import EENDModel, ModelConfig, TrainConfig, train

TINY = ModelConfig(input_dim=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, n_speakers=2, dropout=0.0)


def tiny_model() -> EENDModel:
    torch.manual_seed(0)
    return EENDModel(TINY)


def tiny_batches(batch: int = 4, frames: int = 24):
    """A fixed pool of 12 sequences (some padded); each step draws ``batch`` of them with the generator."""
    g = torch.Generator().manual_seed(123)
    feats = torch.randn(12, frames, TINY.input_dim, generator=g)
    labels = (torch.rand(12, frames, 2, generator=g) > 0.5).float()
    mask = torch.arange(frames)[None, :] >= torch.randint(frames // 2, frames + 1, (12, 1), generator=g)

    def draw(gen):
        i = torch.randint(12, (batch,), generator=gen)
        return feats[i], labels[i], mask[i]

    return draw


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, ckpt: str, steps: int, out: str) -> None:
    from normlab.distributed import process_group

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with process_group(torch.device("cpu")) as (r, w):
        assert (r, w) == (rank, world)
        losses = train(tiny_model(), tiny_batches(), TrainConfig(steps=steps, lr=3e-3, warmup=2, ckpt_every=2),
                       ckpt, config={"tiny": True})
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps(losses))


def test_two_gloo_processes_match_one_and_resume_with_one(tmp_path):
    """Same seed: 2 processes (each half of every batch) give 1 process's loss curve; 1 process resumes their run."""
    torch.set_num_threads(1)
    ref = train(tiny_model(), tiny_batches(), TrainConfig(steps=8, lr=3e-3, warmup=2, ckpt_every=2), tmp_path / "one",
                config={"tiny": True})
    ckpt = tmp_path / "two"
    tmp_mp.spawn(_rank, args=(2, free_port(), str(ckpt), 4, str(tmp_path)), nprocs=2, join=True)
    two = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert two[0] == two[1]  # every rank reports the global loss
    assert two[0] == pytest.approx(ref[:4], rel=1e-5, abs=1e-6)  # equal up to the order of the sums
    state = torch.load(ckpt / "last.pt", weights_only=False)
    assert state["world_size"] == 2 and state["step"] == 4
    assert isinstance(state["provenance"]["torch"], str)
    rows = tracking.read(ckpt / "metrics.csv")  # rank 0 alone writes: each step once
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["loss"] for r in rows] == pytest.approx(two[0], rel=1e-5)
    # one process continues the two-process run to step 8: the same curve as one process all along
    resumed = train(tiny_model(), tiny_batches(), TrainConfig(steps=8, lr=3e-3, warmup=2, ckpt_every=2), ckpt,
                    config={"tiny": True})
    assert resumed == pytest.approx(ref, rel=1e-4, abs=1e-6)
    assert [r["step"] for r in tracking.read(ckpt / "metrics.csv")] == list(range(1, 9))


def _own_folder_rank(rank: int, world: int, port: int, base: str) -> None:
    """A rank whose checkpoint folder is its own (as on a machine's local disk); what train said, in a file."""
    from normlab.distributed import process_group

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        with process_group(torch.device("cpu"), timeout_s=20):
            train(tiny_model(), tiny_batches(), TrainConfig(steps=4, lr=3e-3, warmup=2, ckpt_every=2),
                  pathlib.Path(base, f"node{rank}"), config={"tiny": True})
        said = "finished"
    except Exception as e:  # noqa: BLE001   (the test reads what each rank said)
        said = f"{type(e).__name__}: {e}"
    pathlib.Path(base, f"said{rank}.txt").write_text(said)


def test_ranks_that_find_different_checkpoints_are_refused_before_a_step(tmp_path):
    """Each rank reads the checkpoint folder on its own machine: rank 0's holds step 2, rank 1's none. Trained
    on, rank 0 resumed at step 2 and rank 1 at 0, averaging gradients of other batches into rank 0's checkpoint."""
    torch.set_num_threads(1)
    cfg = TrainConfig(steps=2, lr=3e-3, warmup=2, ckpt_every=2)
    train(tiny_model(), tiny_batches(), cfg, tmp_path / "node0", config={"tiny": True})
    before = (tmp_path / "node0" / "last.pt").read_bytes()
    tmp_mp.spawn(_own_folder_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        said = (tmp_path / f"said{rank}.txt").read_text()
        assert said.startswith("BadValue: the ranks found different checkpoints at "), said
        assert "(rank 0: step 2, rank 1: none)" in said and "\n" not in said
    assert (tmp_path / "node0" / "last.pt").read_bytes() == before  # nothing trained into it
    assert not (tmp_path / "node1" / "last.pt").exists()


def test_resume_with_other_settings_is_refused(tmp_path):
    cfg = TrainConfig(steps=2, ckpt_every=1)
    train(tiny_model(), tiny_batches(), cfg, tmp_path, config={"model": {"d_model": 16}, "batch": 4})
    with pytest.raises(ValueError, match=r"other settings \(model.d_model: 16 -> 32\)"):
        train(tiny_model(), tiny_batches(), TrainConfig(steps=3), tmp_path, config={"model": {"d_model": 32},
                                                                                      "batch": 4})


def test_metrics_csv_drops_rows_after_the_checkpoint_on_resume(tmp_path):
    path = tmp_path / "metrics.csv"
    with tracking.MetricsLog(path) as m:
        for s in range(1, 6):
            m.log(s, 1.0 / s, 1e-3, 0.5, float(s))
    with tracking.MetricsLog(path, resume_step=3) as m:  # steps 4, 5 were after the last checkpoint
        m.log(4, 0.3, 1e-3, 0.5, 4.5)
    assert [r["step"] for r in tracking.read(path)] == [1, 2, 3, 4]
    assert tracking.read(path)[-1]["loss"] == pytest.approx(0.3)


def test_device_resolution():
    assert devices.resolve("cpu") == torch.device("cpu")
    assert devices.check_spec("cuda:1") == "cuda:1"
    with pytest.raises(argparse.ArgumentTypeError, match="cpu, cuda, cuda:N or auto"):
        devices.check_spec("gpu")
    if torch.cuda.is_available():
        assert devices.resolve("auto").type == "cuda"
    else:
        assert devices.resolve("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="--device cuda: no CUDA GPU is available"):
            devices.resolve("cuda")


def test_default_device_keeps_seeded_cpu_draws():
    """Under a device, a draw from a CPU generator gives the CPU's numbers (on the device); others land there too."""
    g = torch.Generator().manual_seed(0)
    cpu = torch.randn(3, generator=g)
    with devices.default_device("meta"):
        g = torch.Generator().manual_seed(0)
        moved = torch.randn(3, generator=g)
        plain = torch.zeros(2)
    assert moved.device.type == "meta" and plain.device.type == "meta" and moved.shape == cpu.shape


def _noise_mixtures(folder: pathlib.Path, n: int = 4, seconds: float = 6.0) -> None:
    """``folder/wav/m<i>.wav`` (8 kHz noise) with ``.rttm`` turns of two speakers: a stand-in for simulated data."""
    import numpy as np
    import soundfile as sf

    (folder / "wav").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        sf.write(folder / "wav" / f"m{i}.wav", rng.standard_normal(int(8000 * seconds)).astype("float32") * 0.1, 8000)
        turns = [("a", 0.5, 2.0), ("b", 2.0, 3.0)]
        (folder / "wav" / f"m{i}.rttm").write_text("".join(
            f"SPEAKER m{i} 1 {start:.2f} {dur:.2f} <NA> <NA> {spk} <NA> <NA>\n" for spk, start, dur in turns))


def _pid_with_env(tag: str, rank: str) -> int | None:
    """The process whose environment holds ``NORMLAB_TEST_TAG=tag`` and ``RANK=rank`` (a torchrun worker)."""
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"NORMLAB_TEST_TAG={tag}".encode() in env and f"RANK={rank}".encode() in env:
            return int(d.name)
    return None


@pytest.mark.skipif(not pathlib.Path("/proc/self/environ").exists(), reason="finds the rank's process in /proc")
def test_torchrun_rank_death_stops_the_run_naming_it_and_a_restart_resumes(tmp_path, capsys):
    import signal
    import subprocess
    import sys
    import time

    from normlab.cli import main

    _noise_mixtures(tmp_path / "data")
    out = tmp_path / "run"
    args = ["diarize", "train", "--data", str(tmp_path / "data"), "--out", str(out), "--d-model", "16", "--n-layers",
            "1", "--batch", "4", "--frames", "40", "--warmup", "2", "--ckpt-every", "2", "--threads", "1",
            "--device", "cpu"]
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, NORMLAB_TEST_TAG=tag, OMP_NUM_THREADS="1")
    # torchrun polls its ranks every 0.1 s by default and ends the survivors with SIGTERM, which on a busy machine
    # can come before rank 0 has seen its peer vanish; a 5 s poll leaves rank 0 the time to say it stopped
    run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--monitor-interval", "5", "--master_port", str(free_port()), "-m", "normlab", *args,
                            "--steps", "100000"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = out / "ckpt" / "last.pt"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and run.poll() is None and not last.exists():
        time.sleep(0.2)  # wait for the first checkpoint
    pid = _pid_with_env(tag, "1")
    assert run.poll() is None and pid is not None, run.communicate()[0][-3000:]
    os.kill(pid, signal.SIGKILL)  # rank 1 dies
    log = run.communicate(timeout=120)[0]
    assert run.returncode != 0
    assert "rank" in log and ("rank      : 1" in log or "rank: 1" in log or "rank 1" in log), log[-3000:]
    # the surviving rank says it stopped in one line (it printed a traceback and "a bug in normlab")
    assert "internal error" not in log and "Traceback" not in log.split("stopped at step")[0][-2000:], log[-3000:]
    assert "normlab diarize train: error: rank 0 of 2 stopped at step" in log, log[-3000:]
    step = torch.load(last, weights_only=False)["step"]
    assert step >= 2 and torch.load(last, weights_only=False)["world_size"] == 2
    # restarted alone (one process), it resumes from the checkpoint and finishes
    assert main([*args, "--steps", str(step + 2)]) == 0
    assert f"trained {step + 2} steps" in capsys.readouterr().out
    rows = tracking.read(out / "ckpt" / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, step + 3))
    blob = torch.load(out / "model.pt", weights_only=True)  # plain types: loads without pickled classes
    assert blob["provenance"]["torch"] == str(torch.__version__)
    # a resume with another model is refused in one line
    assert main([*args, "--steps", str(step + 4), "--d-model", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other settings (model.d_ff: 64 -> 128; model.d_model: 16 -> 32)" in err


def test_tensorboard_gets_the_rows_of_metrics_csv(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'normlab[scale]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tracking.MetricsLog(tmp_path / "metrics.csv", tensorboard=tmp_path / "tb") as m:
        m.log(1, 0.5, 1e-3, 0.25, 0.1)
        m.log(2, 0.4, 2e-3, 0.125, 0.2)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 0.5), (2, pytest.approx(0.4))]
    assert [e.value for e in events.Scalars("train/grad_norm")] == [0.25, 0.125]


def _train_args(data: pathlib.Path, out: pathlib.Path, steps: int = 2) -> list[str]:
    return ["diarize", "train", "--data", str(data), "--out", str(out), "--d-model", "16", "--n-layers", "1",
            "--batch", "2", "--frames", "30", "--warmup", "1", "--ckpt-every", "1", "--threads", "1", "--device",
            "cpu", "--steps", str(steps)]


@pytest.mark.parametrize("env, message", [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 but RANK, MASTER_ADDR, MASTER_PORT not set"),
    ({"WORLD_SIZE": "two"}, "the launcher's WORLD_SIZE='two' is not a whole number >= 1"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
     "MASTER_PORT='99999' is not a whole number from 1 to 65535"),
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "RANK='5' is not a whole number from 0 to 1"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "free", "NORMLAB_JOIN_TIMEOUT": "2"},
     "rank 0 of 2 could not join the others at 127.0.0.1:"),
])
def test_a_launch_that_cannot_form_its_ranks_is_one_line(env, message, tmp_path, monkeypatch, capsys):
    """Torch's tracebacks (and "a bug in normlab") for a launcher's variables that are wrong; a rank started
    alone with WORLD_SIZE=2 waited ten minutes in silence: now NORMLAB_JOIN_TIMEOUT (120 s by default)."""
    import time

    from normlab.cli import main

    _noise_mixtures(tmp_path / "data")
    for k, v in env.items():
        monkeypatch.setenv(k, str(free_port()) if v == "free" else v)
    t0 = time.monotonic()
    assert main(_train_args(tmp_path / "data", tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and time.monotonic() - t0 < 60, err


def test_one_training_per_folder_and_a_resume_checks_the_data(tmp_path, monkeypatch, capsys):
    """Two runs into one --out trained side by side (each replacing the other's checkpoint); the same data
    folder written another way was refused, and other data simulated into it was trained on silently."""
    from normlab.cli import main
    from normlab.diarization.training import provenance
    from normlab.diarization.training.train import run_lock

    _noise_mixtures(tmp_path / "data")
    out = tmp_path / "run"
    with run_lock(out / "ckpt"):
        assert main(_train_args(tmp_path / "data", out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} is being trained by process {os.getpid()}" in err, err
    assert main(_train_args(tmp_path / "data", out)) == 0
    capsys.readouterr()
    provenance.write_pipeline(out / "model.pt", {"eend": {"threshold": 0.45}}, "eend", {"note": "tuned"})
    tuned = (out / "model.pt").read_bytes()  # a choice stored since (diarize tune --save)
    assert main(_train_args(tmp_path / "data", out)) == 0  # run again: nothing left (it said "0.0 sequences/s")
    said = capsys.readouterr().out
    assert "no step left to train: the checkpoint had reached --steps" in said and "left as it is" in said
    assert (out / "model.pt").read_bytes() == tuned  # the rerun rewrote it, erasing the stored choice
    meta = provenance.read(out / "model.pt")  # what made the model file, in the file
    assert meta["steps"] == 2 and meta["training"]["batch"] == 2 and meta["world_size"] == 1
    assert meta["training"]["data"] == [str(tmp_path / "data")] and meta["versions"]["torch"] == torch.__version__
    monkeypatch.chdir(tmp_path)  # the same folder, written as a relative path with a trailing slash
    assert main(_train_args(pathlib.Path("data/"), out, steps=3)) == 0
    capsys.readouterr()
    (tmp_path / "data" / "wav" / "m0.rttm").write_text("SPEAKER m0 1 0.00 4.00 <NA> <NA> c <NA> <NA>\n")
    assert main(_train_args(tmp_path / "data", out, steps=4)) == 2
    assert "other settings (data_digest:" in capsys.readouterr().err


def test_a_checkpoint_normlab_cannot_resume_is_one_line(tmp_path):
    cfg = TrainConfig(steps=2, ckpt_every=1)
    train(tiny_model(), tiny_batches(), cfg, tmp_path, config={"tiny": True})
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    assert state["format"] == 1
    for change, message in [(lambda s: s.pop("gen"), "lacks gen: not a checkpoint normlab can resume"),
                            (lambda s: s.update(format=99), "written by a newer normlab (checkpoint format 99"),
                            (lambda s: s.update(config=None), "does not record the settings it was trained with")]:
        broken = dict(state)
        change(broken)
        torch.save(broken, tmp_path / "last.pt")
        with pytest.raises(ValueError, match=re.escape(message)):
            train(tiny_model(), tiny_batches(), TrainConfig(steps=3), tmp_path, config={"tiny": True})
    (tmp_path / "metrics.csv").write_text("epoch,accuracy\n1,0.5\n")  # someone's own file under the name
    torch.save(state, tmp_path / "last.pt")
    with pytest.raises(ValueError, match="metrics.csv is not a normlab metrics file"):
        train(tiny_model(), tiny_batches(), TrainConfig(steps=3), tmp_path, config={"tiny": True})


def _dropout_rank(rank: int, world: int, port: int, ckpt: str, steps: int, out: str) -> None:
    from normlab.distributed import process_group

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with process_group(torch.device("cpu")) as _:
        torch.manual_seed(0)
        model = EENDModel(ModelConfig(**{**TINY.__dict__, "dropout": 0.3}))
        losses = train(model, tiny_batches(), TrainConfig(steps=steps, lr=3e-3, warmup=2, ckpt_every=2), ckpt,
                       config={"tiny": True})
    pathlib.Path(out, f"rank{rank}-{steps}.json").write_text(json.dumps(losses))


def test_a_resume_with_two_ranks_ends_where_the_uninterrupted_run_ends(tmp_path):
    """Rank 1's dropout was reseeded from the resume step only: its masks after a resume were not the
    uninterrupted run's (rank 0's random state is in the checkpoint; rank 1's is drawn from the step)."""
    torch.set_num_threads(1)
    tmp_mp.spawn(_dropout_rank, args=(2, free_port(), str(tmp_path / "whole"), 6, str(tmp_path)), nprocs=2)
    tmp_mp.spawn(_dropout_rank, args=(2, free_port(), str(tmp_path / "parts"), 4, str(tmp_path)), nprocs=2)
    tmp_mp.spawn(_dropout_rank, args=(2, free_port(), str(tmp_path / "parts"), 6, str(tmp_path)), nprocs=2)
    whole = json.loads((tmp_path / "rank0-6.json").read_text())
    assert json.loads((tmp_path / "rank1-6.json").read_text()) == whole
    # the last spawn wrote rank*-6.json again: the resumed run's losses
    assert torch.load(tmp_path / "parts" / "last.pt", weights_only=False)["losses"] == whole
    whole_state = torch.load(tmp_path / "whole" / "last.pt", weights_only=False)["model"]
    parts_state = torch.load(tmp_path / "parts" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(whole_state[k], parts_state[k]) for k in whole_state)


def test_tensorboard_holds_each_step_once_after_a_resume(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'normlab[scale]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tracking.MetricsLog(tmp_path / "metrics.csv", tensorboard=tmp_path / "tb") as m:
        for s in range(1, 6):
            m.log(s, 1.0 / s, 1e-3, 0.5, float(s))
    with tracking.MetricsLog(tmp_path / "metrics.csv", resume_step=3, tensorboard=tmp_path / "tb") as m:
        for s in (4, 5, 6):  # steps 4 and 5 came after the checkpoint at 3: trained, and logged, again
            m.log(s, 0.1, 1e-3, 0.5, float(s))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    # a run killed before its first checkpoint starts again from step 1: its first steps were drawn twice
    with tracking.MetricsLog(tmp_path / "m2.csv", tensorboard=tmp_path / "tb2") as m:
        for s in (1, 2, 3):
            m.log(s, 1.0, 1e-3, 0.5, float(s))
    with tracking.MetricsLog(tmp_path / "m2.csv", resume_step=0, tensorboard=tmp_path / "tb2") as m:
        for s in (1, 2):
            m.log(s, 0.5, 1e-3, 0.5, float(s))
    events = EventAccumulator(str(tmp_path / "tb2"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 0.5), (2, 0.5)]


def test_ranks_share_the_cores_by_default(tmp_path, monkeypatch, capsys):
    """Under a launcher with 4 ranks on an 8-core machine each rank takes 2 threads (it took 2 whatever the
    ranks: 2 ranks oversubscribed a 2-core machine); alone, 2; --threads decides where given."""
    from normlab.cli import main

    _noise_mixtures(tmp_path / "data")
    before = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    try:
        # a digit to str.isdigit that int() refuses ("²") was int()'s traceback: a value that is no count is unset
        for local, given, want in (("4", [], 2), ("2", [], 4), (None, [], 2), ("4", ["--threads", "3"], 3),
                                   ("\u00b2", [], 2)):
            if local is None:
                monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
            else:
                monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
            args = _train_args(tmp_path / "data", tmp_path / f"r{local}{given}", steps=1)
            i = args.index("--threads")
            del args[i : i + 2]
            assert main([*args, *given]) == 0 and torch.get_num_threads() == want, (local, given)
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()


def test_launcher_values_out_of_range_are_one_line(monkeypatch):
    """LOCAL_RANK=abc was int()'s traceback; a join timeout of 1e14 s timedelta's OverflowError; a Ray port of
    99999 wrapped round to another port."""
    from normlab import devices, distributed
    from normlab._checks import BadValue
    from normlab.studies.ray_executor import _check_reachable

    monkeypatch.setenv("LOCAL_RANK", "abc")
    assert str(devices.resolve("cpu")) == "cpu"  # LOCAL_RANK names a GPU: a CPU run never reads it
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    with pytest.raises(BadValue, match="LOCAL_RANK=.abc. is not a whole number >= 0"):
        devices.resolve("cuda")
    assert str(devices.resolve("cuda:0")) == "cuda:0"
    monkeypatch.undo()
    monkeypatch.setenv("NORMLAB_JOIN_TIMEOUT", "100000000000000")
    with pytest.raises(BadValue, match="NORMLAB_JOIN_TIMEOUT"):
        distributed._join_timeout()
    with pytest.raises(BadValue, match="a port from 1 to 65535"):
        _check_reachable("127.0.0.1:99999")


def test_the_models_that_train_differently_with_the_number_of_processes_are_named():
    """Batch norms normalize over each rank's part of the batch (0.75% and 2.1% apart in the loss at 2 ranks):
    `diarize train` under torchrun warns for such a model, and only for such a model."""
    from normlab.diarization.models.eend import EENDModel, ModelConfig
    from normlab.diarization.training.train import batch_statistics

    def model(**kw):
        return EENDModel(ModelConfig(d_model=16, n_layers=1, d_ff=32, **kw))

    assert batch_statistics(model()) == []
    assert batch_statistics(model(norm="batchnorm")) == ["MaskedBatchNorm"]
    assert batch_statistics(model(encoder="conformer")) == ["MaskedBatchNorm"]  # its convolution module's


def test_a_single_rank_under_a_launcher_dies_with_it(monkeypatch):
    """torchrun --nproc_per_node 1: the rank skipped the launcher-death request (asked only with several ranks),
    outlived a kill -9 of torchrun holding the folder's lock, and a rerun was refused."""
    from normlab import distributed, workers

    asked = []
    monkeypatch.setattr(workers, "die_with_parent", lambda: asked.append(True))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with distributed.process_group("cpu") as (rank, size):
        assert (rank, size) == (0, 1)
    assert asked == [True]
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with distributed.process_group("cpu"):
        pass
    assert asked == [True]  # a process no launcher started keeps its own lifetime


def test_a_rank_that_cannot_reach_rank_0_says_so_in_one_line_of_its_stderr(tmp_path):
    """A rank started alone (rank 1, nobody serving at MASTER_ADDR:MASTER_PORT) printed torch's C++ log of the
    timeout first, 40 lines of stack frames written to file descriptor 2 (past sys.stderr, so capsys never saw
    them), then normlab's one line."""
    import subprocess
    import sys

    _noise_mixtures(tmp_path / "data")
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "NORMLAB_JOIN_TIMEOUT": "2"}
    done = subprocess.run([sys.executable, "-m", "normlab", *_train_args(tmp_path / "data", tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if "Warning" not in line and line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "rank 1 of 2 could not join the others at 127.0.0.1:" in lines[0]


def _listening(port: int) -> bool:
    """Whether a socket of this machine listens on ``port`` (read from /proc: a probe connection would be a client)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["term", "int"])
def test_a_signal_reaches_a_rank_waiting_in_torch_distributed(tmp_path, signum, status):
    """Rank 0 waiting for its peers inside torch's C++ (the join here; a stuck collective alike) heard neither
    Ctrl-C nor SIGTERM: Python runs the handler only when the call returns, the join's minutes later."""
    import subprocess
    import sys
    import time

    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("reads the listening sockets from Linux's /proc")
    _noise_mixtures(tmp_path / "data")
    port = free_port()
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "NORMLAB_JOIN_TIMEOUT": "60"}
    # as from a terminal: a test run started in the background (nohup, CI) hands its children SIGINT ignored
    rank = subprocess.Popen([sys.executable, "-m", "normlab", *_train_args(tmp_path / "data", tmp_path / "run")],
                            env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not _listening(port) and rank.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _listening(port), "rank 0 never served its store"
        time.sleep(0.5)  # waiting for rank 1 now
        sent = time.monotonic()
        rank.send_signal(signum)
        err = rank.communicate(timeout=120)[1]
    finally:
        if rank.poll() is None:
            rank.kill()
    lines = [line for line in err.splitlines() if "warning" not in line and line.strip()]
    assert rank.returncode == status and time.monotonic() - sent < 30, (rank.returncode, err)
    assert len(lines) == 1 and "rank 0 of 2 " in lines[0] and "while it waited in torch.distributed" in lines[0], err


def test_a_rank_that_watches_no_signal_leaves_the_wakeup_descriptor_unset(monkeypatch):
    """With SIGINT ignored (a background job) and SIGTERM at its default (a program using the library), the watch
    set Python's wakeup descriptor to its pipe and closed the pipe: every later signal wrote to a closed (or
    reused) descriptor."""
    from normlab.distributed import _heard_while_blocked

    monkeypatch.setattr(signal, "getsignal", lambda s: signal.SIG_IGN if s == signal.SIGINT else signal.SIG_DFL)
    with _heard_while_blocked(0, 2):
        pass
    assert signal.set_wakeup_fd(-1) == -1


def test_a_rank_whose_master_port_never_answers_says_so_in_one_line(tmp_path):
    """Another program on MASTER_PORT that accepts and never answers: the store's own timeout did not cover it,
    and the rank waited there in silence for good. The join's watchdog ends it with one line."""
    import subprocess
    import sys

    _noise_mixtures(tmp_path / "data")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections are accepted by the kernel's backlog; nothing is ever read or written
        env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(silent.getsockname()[1]), "NORMLAB_JOIN_TIMEOUT": "1"}
        done = subprocess.run([sys.executable, "-m", "normlab", *_train_args(tmp_path / "data", tmp_path / "run")],
                              env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if "Warning" not in line and line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "rank 1 of 2 could not join the others at 127.0.0.1:" in lines[0]


def test_ranks_of_a_run_refused_by_the_folder_lock_all_say_why_in_one_line(tmp_path):
    """Rank 0 alone takes the folder's lock: where another run held it, rank 0 said so and rank 1 failed at its
    first collective ("Connection closed by peer ... run the same command again to resume")."""
    import subprocess
    import sys

    from normlab.diarization.training.train import run_lock

    _noise_mixtures(tmp_path / "data")
    out = tmp_path / "run"
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    with run_lock(out / "ckpt"):
        ranks = [subprocess.Popen([sys.executable, "-m", "normlab", *_train_args(tmp_path / "data", out)],
                                  env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
                 for r in range(2)]
        said = [p.communicate(timeout=120)[1] for p in ranks]
    held = f"{out} is being trained by process {os.getpid()}"
    for r, (p, err) in enumerate(zip(ranks, said)):
        lines = [line for line in err.splitlines() if "Warning" not in line and line.strip()]
        assert p.returncode == 2 and len(lines) == 1 and held in lines[0], (r, err)
    assert "rank 0 did not start" in said[1]
    assert not (out / "ckpt" / "last.pt").exists()


def test_ranks_of_a_run_whose_folder_cannot_be_locked_all_say_why_in_one_line(tmp_path):
    """Rank 0 stopped with one line where the lock could not be made (an OS error, not a held lock), and rank 1
    died at the broadcast with gloo's "Connection reset by peer" and a traceback."""
    import subprocess
    import sys

    _noise_mixtures(tmp_path / "data")
    out = tmp_path / "run"
    (out / "ckpt" / ".normlab.lock").mkdir(parents=True)  # the lock's name taken by a folder: open() fails
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-m", "normlab", *_train_args(tmp_path / "data", out)],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    said = [p.communicate(timeout=120)[1] for p in ranks]
    for r, (p, err) in enumerate(zip(ranks, said)):
        lines = [line for line in err.splitlines() if "Warning" not in line and line.strip()]
        assert p.returncode == ranks[0].returncode != 0 and len(lines) == 1, (r, err)
        assert "Traceback" not in err and ".normlab.lock" in lines[0], (r, err)
    assert "rank 0 did not start" in said[1]


def _barrier_lost(rank, world, port, out):
    import torch.distributed as dist

    from normlab import distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

    def lost():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer\nmore lines")

    dist.barrier = lost  # the peer vanished after its part, before the last barrier
    try:
        with distributed.process_group("cpu"):
            pass
        said = "no error"
    except Exception as e:  # noqa: BLE001 - the test reads what was raised
        said = f"{type(e).__name__}: {e}"
    pathlib.Path(out, f"{rank}.json").write_text(json.dumps({"said": said, "initialized": dist.is_initialized()}))


def test_a_rank_lost_at_the_last_barrier_is_one_line_and_the_group_is_torn_down(tmp_path):
    """A rank killed after its part made the others' final barrier raise gloo's RuntimeError (a traceback as
    "internal error"), and their process group was never destroyed."""
    tmp_mp.spawn(_barrier_lost, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        said = got["said"]
        assert said.startswith(f"Unavailable: rank {rank} of 2 finished its part, but another rank stopped "
                               "before the end (") and "Connection reset by peer" in said and "more lines" not in said
        assert got["initialized"] is False


def _roll_call_rank(i, launch, port, out):
    """Process ``i`` of a launch given as ``(RANK, WORLD_SIZE)`` pairs: what it said and how long it took."""
    import time

    from normlab import distributed

    rank, world = launch[i]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      NORMLAB_JOIN_TIMEOUT="5")
    time.sleep(0.3 * (i > 0))  # rank 0 serves the store: it starts first
    started = time.monotonic()
    try:
        with distributed.process_group("cpu", timeout_s=60):
            time.sleep(6)  # a run: a process that starts late (three share two cores) still finds it
        said = "joined"
    except Exception as e:  # noqa: BLE001 - the test reads what was raised
        said = f"{type(e).__name__}: {e}"
    pathlib.Path(out, f"{i}.json").write_text(json.dumps({"said": said, "s": time.monotonic() - started}))


@pytest.mark.parametrize("launch", [((0, 2), (1, 3)), ((0, 2), (1, 2), (1, 2))], ids=["worlds", "one-rank"])
def test_ranks_of_another_world_size_or_one_rank_twice_are_refused_at_the_join(tmp_path, launch):
    """Ranks started with different WORLD_SIZEs, or two processes of one RANK, passed the join and waited in
    torch's process group for the collectives' timeout (ten minutes by default), then ended in a traceback."""
    tmp_mp.spawn(_roll_call_rank, args=(launch, free_port(), str(tmp_path)), nprocs=len(launch), join=True)
    got = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(len(launch))]
    assert all(g["s"] < 30 for g in got), got  # the join's 5 s, not the collectives' 60
    said = sorted(g["said"] for g in got)
    if len(launch) == 2:
        assert said[0].startswith("BadValue: rank 1 was started with WORLD_SIZE=3, rank 0 with 2: every rank "
                                  "needs the same WORLD_SIZE"), said
        assert said[1].startswith("Unreachable: rank 1 of 3 "), said
    else:
        assert said == ["BadValue: another process joined as rank 1 of 2 already: each process needs its own RANK "
                        "from 0 to WORLD_SIZE - 1 (torchrun sets them)", "joined", "joined"], said


ELASTIC = """
import os, pathlib, sys
from normlab.distributed import process_group
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with process_group("cpu", timeout_s=30) as (rank, world):
    if attempt == "0" and rank == 1:
        sys.exit(3)  # the first attempt fails: torchrun starts every rank again, on the store it keeps
    import torch, torch.distributed as dist
    total = torch.ones(1)
    dist.all_reduce(total)  # the restarted ranks reach each other (not an address of the attempt before)
pathlib.Path(sys.argv[1], f"attempt{attempt}.rank{rank}").write_text(str(int(total.item())))
"""


def test_torchrun_restarts_its_ranks_past_the_roll_call(tmp_path):
    """torchrun --max-restarts keeps its store across restarts: each restarted rank found its own roll-call entry
    of the attempt before and stopped as "another process joined as rank R already"."""
    import subprocess
    import sys

    (tmp_path / "elastic.py").write_text(ELASTIC)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts",
                          "1", "--monitor-interval", "0.2", str(tmp_path / "elastic.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "NORMLAB_JOIN_TIMEOUT": "30"})
    done = {p.name: p.read_text() for p in tmp_path.glob("attempt*")}
    assert run.returncode == 0 and done == {"attempt1.rank0": "2", "attempt1.rank1": "2"}, (done, run.stderr[-2000:])


def test_a_peer_lost_before_the_first_step_is_one_line(monkeypatch):
    """Two processes started with one RANK: one of them lost its peer at the broadcast before the first step, and
    printed gloo's traceback and "a bug in normlab"."""
    import contextlib

    import torch.distributed as dist

    from normlab._checks import Unavailable
    from normlab.distributed import on_rank0

    def lost(*args, **kw):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29741")

    monkeypatch.setattr(dist, "broadcast_object_list", lost)
    with pytest.raises(Unavailable, match=r"rank 1 of 2 lost the other ranks before the first step \(.*Connection "
                                          r"closed by peer.*\): each process needs its own RANK"):
        with on_rank0(contextlib.nullcontext, 1, 2):
            pass
    refused = RuntimeError("a bug of rank 0's own")

    def enter():
        raise refused

    with pytest.raises(RuntimeError) as e:  # rank 0's own error is raised as it is, not as a lost peer
        with on_rank0(enter, 0, 2):
            pass
    assert e.value is refused


def _own_error_rank(rank: int, world: int, port: int, base: str) -> None:
    """Rank 1 fails at its second step with an error of its own (a layer's bug); what each rank raised, in a file."""
    from normlab.distributed import process_group

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    draw, calls = tiny_batches(), []

    def batches(gen):
        calls.append(1)
        if rank == 1 and len(calls) == 2:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (a layer's own bug)")
        return draw(gen)

    try:
        with process_group(torch.device("cpu"), timeout_s=20):
            train(tiny_model(), batches, TrainConfig(steps=4, lr=3e-3, warmup=2, ckpt_every=2),
                  pathlib.Path(base, "ckpt"), config={"tiny": True})
        said = "finished"
    except Exception as e:  # noqa: BLE001   (the test reads what each rank said)
        said = f"{type(e).__name__}: {e}"
    pathlib.Path(base, f"said{rank}.txt").write_text(said)


def test_a_ranks_own_error_keeps_its_kind_and_its_peers_say_they_lost_it(tmp_path):
    """Every RuntimeError in the loop of a multi-rank run was said as a lost peer, in one line: a rank's own bug
    lost its traceback and read "a rank that died is named by the launcher"."""
    from normlab.distributed import peer_failure

    tmp_mp.spawn(_own_error_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    said = [(tmp_path / f"said{r}.txt").read_text() for r in range(2)]
    assert said[1] == "RuntimeError: mat1 and mat2 shapes cannot be multiplied (a layer's own bug)", said
    assert said[0].startswith("Unavailable: rank 0 of 2 stopped at step 2: "), said
    assert peer_failure(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:1"))
    assert not peer_failure(RuntimeError("CUDA out of memory")) and not peer_failure(ValueError("gloo"))


def test_a_kill_after_the_last_checkpoint_leaves_no_earlier_model_as_this_ones(tmp_path, monkeypatch, capsys):
    """A run extended from 2 to 4 steps, killed after its last checkpoint and before the model was written: the
    rerun had no step left and kept the 2-step model.pt as the 4-step run's ("left as it is")."""
    from normlab.cli import main
    from normlab.diarization.training import provenance

    _noise_mixtures(tmp_path / "data")
    out = tmp_path / "run"
    assert main(_train_args(tmp_path / "data", out, steps=2)) == 0
    real = os.replace

    def killed(src, dst):  # the model about to be moved into place: the process dies there
        if str(dst).endswith("model.pt"):
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(os, "replace", killed)
    assert main(_train_args(tmp_path / "data", out, steps=4)) == 130
    monkeypatch.setattr(os, "replace", real)
    assert provenance.read(out / "model.pt")["steps"] == 2 and torch.load(out / "ckpt" / "last.pt")["step"] == 4
    capsys.readouterr()
    assert main(_train_args(tmp_path / "data", out, steps=4)) == 0
    said = capsys.readouterr().out
    assert provenance.read(out / "model.pt")["steps"] == 4 and f"wrote {out / 'model.pt'}" in said
    assert "metrics.csv" not in said  # no step left: nothing written there
    assert main(_train_args(tmp_path / "data", out, steps=4)) == 0  # now it is this run's: left as it is
    assert "left as it is" in capsys.readouterr().out
    assert main(_train_args(tmp_path / "data", out, steps=6)) == 0  # resumed: what this session trained, said
    said = capsys.readouterr().out
    assert "trained 6 steps (2 in this session)" in said and f"and {out / 'ckpt' / 'metrics.csv'}" in said
