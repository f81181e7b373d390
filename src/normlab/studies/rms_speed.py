"""Claim 12a: RMSNorm is cheaper than LayerNorm, like for like (Zhang & Sennrich 2019)."""
from __future__ import annotations

import time

import torch

from .. import reference
from .base import Context, claim, finish, pyplot

NAME, TITLE = "rms_speed", "RMSNorm vs LayerNorm cost, like for like (Zhang & Sennrich 2019)"


def speed_cell(cfg: dict) -> dict:
    """Best-of-``repeats`` forward+backward of the two reference implementations on ``n x d`` float32."""
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randn(cfg["n"], cfg["d"], generator=g)
    dy = torch.randn(cfg["n"], cfg["d"], generator=g)
    w, b = torch.ones(cfg["d"]), torch.zeros(cfg["d"])

    def ln():
        _, cache = reference.layer_norm_forward(x, w, b, 1e-5)
        reference.layer_norm_backward(dy, cache)

    def rms():
        _, cache = reference.rms_norm_forward(x, w, 1e-6)
        reference.rms_norm_backward(dy, cache)

    best = {"layernorm": float("inf"), "rmsnorm": float("inf")}
    for _ in range(2):  # warm-up
        ln(), rms()
    for i in range(cfg["repeats"]):
        for name, fn in (("layernorm", ln), ("rmsnorm", rms)) if i % 2 == 0 else (("rmsnorm", rms), ("layernorm", ln)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {"ms": {k: v * 1e3 for k, v in best.items()}}


def run(ctx: Context) -> dict:
    cfg = {"n": 8192, "d": 256, "repeats": ctx.pick(3, 3, 7), "seed": 0}
    ms = ctx.runner.map(NAME, speed_cell, [cfg])[0]["ms"]
    ratio = ms["rmsnorm"] / ms["layernorm"]
    claims = [
        claim("12a", "RMSNorm is cheaper than LayerNorm: 7%-64% less time", "Zhang & Sennrich 2019",
              {"ms": ms, "rms/ln": ratio}, "reference implementations, 8192x256 float32 forward+backward, "
              "best of 3: RMSNorm time <= 0.93x LayerNorm's", ratio <= 0.93),
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(list(ms), list(ms.values()), color=["C0", "C1"])
    ax.set(ylabel="ms, forward+backward (best of repeats)", title=f"Reference implementations, ratio {ratio:.2f}")
    return finish(ctx, fig, NAME, TITLE, claims)
