"""1 process vs N gloo processes on the same data and seed: loss-curve difference and step time.

    python benchmarks/ddp_compare.py DATA [--steps 20] [--procs 2] [--dropout 0]

DATA is a folder written by ``normlab diarize simulate``. With dropout 0 the
two runs see the same global batches and the same weights, so their losses
differ only by the order of the floating-point sums (DDP's all-reduce); with
dropout each rank draws its own masks. Each process uses one thread; the
single process is timed with 1 thread and with N threads (the same cores).
Step time is the median over steps after the first (``metrics.csv``).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import tempfile

import torch
import torch.multiprocessing as mp

from normlab import tracking
from normlab.diarization import EENDModel, ModelConfig, TrainConfig, train
from normlab.diarization.data.dataset import MixtureSet
from normlab.distributed import process_group


def _run(rank: int, world: int, port: int, data: str, out: str, steps: int, dropout: float, threads: int) -> None:
    if world > 1:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    with process_group(torch.device("cpu")):
        mixtures = MixtureSet(data)
        torch.manual_seed(0)
        model = EENDModel(ModelConfig(dropout=dropout))
        train(model, mixtures.batches(8, 500), TrainConfig(steps=steps, warmup=5, ckpt_every=10_000), out)


def _step_s(rows: list[dict]) -> float:
    return statistics.median(rows[i]["seconds"] - rows[i - 1]["seconds"] for i in range(2, len(rows)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.0)
    a = p.parse_args()
    MixtureSet(a.data)  # feature caches written once, before the ranks read them
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, world, threads in (("1 process, 1 thread", 1, 1), (f"1 process, {a.procs} threads", 1, a.procs),
                                     (f"{a.procs} processes, 1 thread each", a.procs, 1)):
            out = pathlib.Path(tmp, name.replace(" ", "_").replace(",", ""))
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            args = (world, port, a.data, str(out), a.steps, a.dropout, threads)
            if world == 1:
                _run(0, *args)
            else:
                mp.spawn(_run, args=args, nprocs=world, join=True)
            runs[name] = tracking.read(out / "metrics.csv")
    ref = runs["1 process, 1 thread"]
    report = {}
    for name, rows in runs.items():
        diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(ref, rows))
        rel = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(ref, rows))
        report[name] = {"step_s": round(_step_s(rows), 3), "sequences_per_s": round(8 / _step_s(rows), 2),
                        "max_abs_loss_diff_vs_1x1": diff, "max_rel_loss_diff_vs_1x1": rel}
    print(json.dumps({"steps": a.steps, "dropout": a.dropout, "batch": 8, "frames": 500, "runs": report}, indent=2))


if __name__ == "__main__":
    main()
