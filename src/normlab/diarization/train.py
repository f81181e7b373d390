"""Training loop for :class:`EENDModel`: PIT loss, warmup, clipping, checkpoints, resume after a kill."""
from __future__ import annotations

import math
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .pit import pit_bce

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # feats (B,T,F), labels (B,T,S), pad mask (B,T)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000  # optimizer steps in total (a resumed run continues to this)
    lr: float = 1e-3  # peak learning rate (Adam 0.9, 0.98)
    warmup: int = 200  # linear warmup steps
    clip: float = 5.0  # gradient-norm clip
    ckpt_every: int = 100  # steps between checkpoints
    seed: int = 0  # seeds the batch generator and dropout
    decay: str = "none"  # after warmup: "none" (constant) or "cosine" (to 5% of lr at the last step)

    def __post_init__(self):
        if self.decay not in ("none", "cosine"):
            raise ValueError(f"decay must be 'none' or 'cosine', got {self.decay!r}")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based)."""
        warm = min(1.0, (step + 1) / max(self.warmup, 1))
        if self.decay == "none" or step < self.warmup:
            return self.lr * warm
        frac = (step - self.warmup) / max(self.steps - self.warmup, 1)
        return self.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _save(path: pathlib.Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill never leaves a half-written checkpoint


def train(model: torch.nn.Module, batches: Callable[[torch.Generator], Batch], cfg: TrainConfig,
          ckpt_dir: str | pathlib.Path, progress: Callable[[int, int, float], None] | None = None) -> list[float]:
    """Train ``model`` in place; returns the loss of every step (including resumed ones).

    ``batches(gen)`` draws one batch using ``gen``. ``ckpt_dir/last.pt`` holds
    the model, optimizer, step, losses and both random states; if it exists,
    training resumes from it, so a run killed at any moment repeats at most
    ``ckpt_every`` steps and ends bitwise where an uninterrupted run ends.
    """
    ckpt_dir = pathlib.Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    last = ckpt_dir / "last.pt"
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    step, losses, seconds = 0, [], 0.0
    if last.exists():
        state = torch.load(last, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        step, losses, seconds = state["step"], state["losses"], state.get("seconds", 0.0)
    model.train()
    t0 = time.perf_counter() - seconds  # wall time of all sessions of this run, kept in the checkpoint
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(step)
        feats, labels, mask = batches(gen)
        loss, _ = pit_bce(model(feats, mask), labels, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        step += 1
        losses.append(loss.item())
        if step % cfg.ckpt_every == 0 or step == cfg.steps:
            _save(last, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                         "losses": losses, "gen": gen.get_state(), "torch_rng": torch.get_rng_state(),
                         "seconds": time.perf_counter() - t0})
        if progress:
            progress(step, cfg.steps, losses[-1])
    return losses
