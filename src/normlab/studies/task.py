"""The common setting of the studies (``docs/studies.md``): a tiny encoder on sequence reversal.

d=64, 4 heads, d_ff=128, learned positions (initialized N(0, 1) like the token
embedding), token embedding + linear head;
reverse 16 symbols from 32; batch 32; Adam (0.9, 0.98); cross-entropy
(chance = ln 32 = 3.47). Matrices Xavier-normal, biases zero (Xiong et al.'s
assumptions). Budgets are in steps. Every cell function here is pure:
``config -> JSON-able dict``, seeded by ``config["seed"]``.
"""
from __future__ import annotations

import functools
import math
import time

import torch
import torch.nn.functional as TF
from torch import nn

from .. import kernels, tracking
from ..lab.diagnostics import diagnose, watch_branch
from ..models.transformer import TransformerEncoder

VOCAB, LENGTH, BATCH, D, HEADS, D_FF = 32, 16, 32, 64, 4, 128
CHANCE = math.log(VOCAB)
DIVERGE_AT = 1e3  # a loss above this (or non-finite) is a divergence


class ReversalModel(nn.Module):
    """``tokens [B, T] -> logits [B, T, VOCAB]``."""

    def __init__(self, placement: str, norm: str = "layernorm", layers: int = 6, d_ff: int = D_FF, heads: int = HEADS,
                 activation: str = "gelu", pos: str = "learned"):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.encoder = TransformerEncoder(D, heads, layers, d_ff, norm=norm, placement=placement, pos=pos,
                                          max_len=LENGTH, init="xavier", activation=activation)
        if pos == "learned":  # at the token embedding's scale: at 0.02 the position signal is too weak to learn
            nn.init.normal_(self.encoder.pos.table)  # reversal in 300 steps (every run stayed near chance)
        self.head = nn.Linear(D, VOCAB)
        nn.init.xavier_normal_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(tokens)))  # B, T, V


def reversal_batch(gen: torch.Generator, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, VOCAB, (batch, LENGTH), generator=gen)  # B, T
    return x, x.flip(1)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return TF.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def _eager(cell):
    """Run a cell with eager kernels: at d=64 they beat compiled calls (~70 us each) and skip compiling."""

    @functools.wraps(cell)
    def run(cfg: dict) -> dict:
        with kernels.use_compiled(False):
            return cell(cfg)

    return run


def _model(cfg: dict) -> ReversalModel:
    torch.manual_seed(cfg["seed"])
    return ReversalModel(cfg["placement"], cfg.get("norm", "layernorm"), cfg["layers"], cfg.get("d_ff", D_FF),
                         cfg.get("heads", HEADS), cfg.get("activation", "gelu"))


@_eager
def train_cell(cfg: dict) -> dict:
    """Train for ``steps`` with linear warmup over ``warmup`` steps then constant ``lr``.

    Returns ``final_loss`` (mean of the last 20 steps), a loss curve every 10
    steps, and ``status`` ``"diverged"`` with ``diverged_step`` if the loss
    became non-finite or exceeded :data:`DIVERGE_AT`.
    """
    model = _model(cfg)
    gen = torch.Generator().manual_seed(10_000 + cfg["seed"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.98), foreach=True)
    warm = cfg.get("warmup", 0)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(cfg["steps"]):
        for g in opt.param_groups:
            g["lr"] = cfg["lr"] * min(1.0, (step + 1) / warm) if warm else cfg["lr"]
        x, y = reversal_batch(gen)
        loss = loss_of(model, x, y)
        value = loss.item()
        if not math.isfinite(value) or value > DIVERGE_AT:
            return {"status": "diverged", "diverged_step": step, "final_loss": None, "curve": losses[::10]}
        losses.append(value)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if tracking.active():  # metrics.csv of this cell (the runner writes it beside its store)
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
            tracking.log_step(step + 1, value, opt.param_groups[0]["lr"], norm.item(), time.perf_counter() - t0)
        opt.step()
    tail = losses[-20:]
    return {"status": "ok", "final_loss": sum(tail) / len(tail), "curve": losses[::10]}


def final_loss(result: dict) -> float:
    """A run's final loss; a diverged run counts as infinitely bad."""
    return math.inf if result.get("final_loss") is None else result["final_loss"]


@_eager
def init_cell(cfg: dict) -> dict:
    """Per-layer diagnostics at initialization for one task batch (no training)."""
    model = _model(cfg)
    gen = torch.Generator().manual_seed(20_000 + cfg["seed"])
    x, y = reversal_batch(gen)
    if cfg.get("no_pos"):  # the lemma's input is x_0 itself: no positional table added
        with torch.no_grad():
            model.encoder.pos.table.zero_()
    if cfg.get("zero_qk"):  # Xiong's Lemma 2 setting: uniform attention
        with torch.no_grad():
            for layer in model.encoder.layers:
                layer.attn.fn.q_proj.weight.zero_()
                layer.attn.fn.k_proj.weight.zero_()
    h = model.emb(x)
    if cfg.get("gaussian_input"):  # x_0 ~ N(0, I) as in the lemma
        h = torch.randn(h.shape, generator=gen)
    rows = diagnose(model.encoder, h.detach(),
                    loss_fn=lambda out: TF.cross_entropy(model.head(out).reshape(-1, VOCAB), y.reshape(-1)))
    if cfg.get("ln_input"):  # ||x^(post,5)_l||^2 / d: what enters each FFN unit's main norm (Xiong's Lemma 2)
        sums: list[float] = []

        def norm2_per_d(x, f):
            sums.append(((x + f).pow(2).sum(-1) / x.shape[-1]).mean().item())

        handles = [watch_branch(layer.ffn, norm2_per_d) for layer in model.encoder.layers]
        try:
            with torch.no_grad():
                model.encoder(h.detach())
        finally:
            for handle in handles:
                handle.remove()
        for row, v in zip(rows, sums):
            row["ffn_sum_norm2_per_d"] = v
    return {"rows": rows}
