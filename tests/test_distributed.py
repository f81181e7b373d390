"""Data-parallel training (gloo, 2 local processes), devices, metrics.csv, resume across world sizes."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket

import pytest
import torch
import torch.multiprocessing as tmp_mp

from normlab import devices, tracking
from normlab.diarization.model import EENDModel, ModelConfig
from normlab.diarization.train import TrainConfig, train

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
