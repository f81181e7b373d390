"""One command from nothing to a scored model: simulate, train, tune on dev, score on test.

``normlab diarize recipe --out DIR`` runs it; with the defaults it produces
the model shipped in the package (``EENDModel.load()``). Every stage is
cached or checkpointed under ``DIR``, so a killed run resumes where it
stopped. The threshold and median width are chosen on the dev split (voices
disjoint from train and test) and the test split is scored once, with them.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .dataset import MixtureSet
from .evaluate import evaluate, folder_probs, reference_of, tune
from .model import EENDModel, ModelConfig
from .simulate import SimConfig, simulate
from .train import TrainConfig, train

Progress = Callable[[int, int, str], None]
REVERB_RT60 = (0.2, 0.6)  # seconds; the reverberant sets use seed + 1: other conversations than the dry ones


@dataclass(frozen=True)
class RecipeConfig:
    n_train: int = 500  # simulated training mixtures (train voices)
    n_dev: int = 24  # for the threshold and median width (dev voices)
    n_test: int = 30  # scored once (test voices)
    n_flite: int = 20  # scored once, another synthesizer (skipped where flite is not installed)
    n_train_reverb: int = 250  # extra training mixtures in a room (RT60 in REVERB_RT60)
    n_test_reverb: int = 20  # scored once, test voices in a room
    n_speakers: int = 2
    beta: float = 2.0
    steps: int = 3500
    lr: float = 1e-3
    warmup: int = 300
    decay: str = "cosine"
    batch: int = 8
    frames: int = 500  # 100 ms frames per training window
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    norm: str = "layernorm"
    placement: str = "pre"
    encoder: str = "transformer"  # or "conformer"
    seed: int = 0

    def model_config(self) -> ModelConfig:
        return ModelConfig(d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers,
                           d_ff=4 * self.d_model, n_speakers=self.n_speakers, norm=self.norm,
                           placement=self.placement, encoder=self.encoder)

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, lr=self.lr, warmup=self.warmup, decay=self.decay,
                           ckpt_every=max(1, min(100, self.steps // 10)), seed=self.seed)


def _splits(cfg: RecipeConfig) -> list[tuple[str, SimConfig]]:
    """(folder name, simulation) of every set the recipe uses."""
    def sim(split: str, n: int, rt60=None, seed: int = cfg.seed) -> SimConfig:
        return SimConfig(n_mixtures=n, n_speakers=cfg.n_speakers, beta=cfg.beta, split=split, seed=seed, rt60=rt60)

    sets = [("train", sim("train", cfg.n_train)), ("dev", sim("dev", cfg.n_dev)), ("test", sim("test", cfg.n_test))]
    if cfg.n_train_reverb:
        sets.append(("train_reverb", sim("train", cfg.n_train_reverb, REVERB_RT60, cfg.seed + 1)))
    if cfg.n_test_reverb:
        sets.append(("test_reverb", sim("test", cfg.n_test_reverb, REVERB_RT60, cfg.seed + 1)))
    if cfg.n_flite and shutil.which("flite"):
        sets.append(("flite", sim("flite", cfg.n_flite)))
    return sets


def simulate_splits(data: str | pathlib.Path, cfg: RecipeConfig, progress: Progress | None = None,
                    jobs: int = 1) -> pathlib.Path:
    """``data/{train,dev,test,...}`` for ``cfg`` with ``jobs`` processes (existing mixtures are reused)."""
    data = pathlib.Path(data)
    for name, sim in _splits(cfg):
        simulate(data / name, sim, progress=(lambda i, n, uri, s=name: progress(i - 1, n, f"simulate {s} {uri}"))
                 if progress else None, jobs=jobs)
    return data


def train_model(data: pathlib.Path, out: pathlib.Path, cfg: RecipeConfig,
                progress: Progress | None = None) -> tuple[EENDModel, list[float]]:
    """Train on ``data/train`` (and ``data/train_reverb``) with checkpoints in ``out/ckpt`` (resumes)."""
    folders = [data / "train"] + ([data / "train_reverb"] if cfg.n_train_reverb else [])
    mixtures = MixtureSet(folders, n_speakers=cfg.n_speakers)
    torch.manual_seed(cfg.seed)
    model = EENDModel(cfg.model_config())
    losses = train(model, mixtures.batches(cfg.batch, cfg.frames), cfg.train_config(), out / "ckpt",
                   (lambda s, n, loss: progress(s - 1, n, f"train loss {loss:.4f}")) if progress else None)
    return model.eval(), losses


def _der(probs: dict, ref: dict, post: dict) -> dict:
    out = {}
    for collar in (0.25, 0.0):
        r = evaluate(probs, ref, collar=collar, **post)
        out[f"collar_{collar:g}"] = {"der": r.der, "false_alarm": r.false_alarm / r.total,
                                     "missed": r.missed / r.total, "confusion": r.confusion / r.total}
    return out


def score_model(model: EENDModel, data: pathlib.Path) -> dict:
    """Tune post-processing on ``data/dev`` (sets ``model.postprocess``), then DER on ``data/test``
    (and on ``data/test_reverb`` and ``data/flite`` where they exist)."""
    dev_probs, dev_ref = folder_probs(model, data / "dev"), reference_of(data / "dev")
    best, grid = tune(dev_probs, dev_ref, collar=0.25)
    model.postprocess.update(best)
    test_probs, test_ref = folder_probs(model, data / "test"), reference_of(data / "test")
    result = {"postprocess": best, "dev_grid": grid, "dev_der": min(g["der"] for g in grid),
              "test": _der(test_probs, test_ref, best), "test_recordings": len(test_probs),
              "test_der_untuned_0.5_11": evaluate(test_probs, test_ref, collar=0.25, threshold=0.5, median=11).der}
    for extra in ("test_reverb", "flite"):  # scored once each, with the dev-tuned setting
        if (data / extra / "ref.rttm").exists():
            probs = folder_probs(model, data / extra)
            result[extra] = _der(probs, reference_of(data / extra), best)
            result[f"{extra}_recordings"] = len(probs)
    return result


def run_recipe(out: str | pathlib.Path, cfg: RecipeConfig = RecipeConfig(), *, data: str | pathlib.Path | None = None,
               progress: Progress | None = None, jobs: int = 1) -> dict:
    """Simulate (into ``data``, default ``out/data``), train, tune, score; write ``out/model.pt`` and ``out/results.json``."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data = simulate_splits(data or out / "data", cfg, progress, jobs)
    t1 = time.time()
    model, losses = train_model(data, out, cfg, progress)
    t2 = time.time()
    train_seconds = torch.load(out / "ckpt" / "last.pt", weights_only=False).get("seconds", t2 - t1)
    result = {"config": asdict(cfg), **score_model(model, data),
              "final_loss": sum(losses[-50:]) / len(losses[-50:]),
              "parameters": sum(p.numel() for p in model.parameters()),
              "seconds": {"simulate": round(t1 - t0, 1), "train": round(train_seconds, 1),
                          "score": round(time.time() - t2, 1)}}
    model.save(out / "model.pt")
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
