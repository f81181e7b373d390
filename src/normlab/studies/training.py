"""Training claims: warmup (5), deep Post-LN (6), Admin (9), DyT (13), RMSNorm quality (12b), the lr x depth grid.

Every claim uses ``ctx.seeds`` seeds (3 quick, 5 full) and compares the mean
final loss (last 20 steps); a diverged run counts as infinite loss.
"""
from __future__ import annotations

import math

from .base import Context, claim, finish, mean, pyplot
from .task import CHANCE, final_loss, train_cell

NAME, TITLE = "training", "Training stability: warmup, depth, learning rate (Xiong, Liu, DeepNet, Zhu)"
GRID_PLACEMENTS = ("none", "post", "pre", "sandwich", "deepnorm", "admin", "mixln")


def _seeded(ctx, steps, **cfg) -> list[dict]:
    return [{"steps": steps, "warmup": 0, "norm": "layernorm", **cfg, "seed": s} for s in ctx.seeds]


def _loss(runs) -> float:
    return mean(final_loss(r) for r in runs)


def run(ctx: Context) -> dict:
    steps = ctx.pick(60, 300, 300)
    deep = ctx.pick(6, 12, 12)
    g_depths = ctx.pick([2, 6], [2, 6, 12], [2, 6, 12, 24])
    g_lrs = ctx.pick([1e-3, 1e-2], [1e-4, 1e-3, 1e-2], [1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    g_steps = ctx.pick(60, 150, 300)
    groups: dict = {
        "post, no warmup": _seeded(ctx, steps, placement="post", layers=6, lr=3e-3),
        "post, 100-step warmup": _seeded(ctx, steps, placement="post", layers=6, lr=3e-3, warmup=100),
        "pre, no warmup": _seeded(ctx, steps, placement="pre", layers=6, lr=3e-3),
        "dyt": _seeded(ctx, steps, placement="pre", norm="dyt", layers=6, lr=1e-3),
        "ln6": _seeded(ctx, steps, placement="pre", layers=6, lr=1e-3),
        "rms6": _seeded(ctx, steps, placement="pre", norm="rmsnorm", layers=6, lr=1e-3),
    }
    for p, lr in [("post", 1e-3), ("post", 3e-3), ("pre", 1e-3), ("pre", 3e-3), ("deepnorm", 1e-3),
                  ("deepnorm", 3e-3), ("admin", 1e-3)]:
        groups[(p, lr)] = _seeded(ctx, steps, placement=p, layers=deep, lr=lr)
    for p in GRID_PLACEMENTS:  # "none": a pre stack whose norms are the identity
        for n in g_depths:
            for lr in g_lrs:
                groups[("grid", p, n, lr)] = [{"placement": "pre" if p == "none" else p,
                                               "norm": "none" if p == "none" else "layernorm", "layers": n,
                                               "lr": lr, "steps": g_steps, "warmup": 0, "seed": 0}]
    flat = [c for cfgs in groups.values() for c in cfgs]  # one map: every cell in parallel
    results = iter(ctx.runner.map(NAME, train_cell, flat))
    runs = {k: [next(results) for _ in cfgs] for k, cfgs in groups.items()}

    warm = {k: runs[k] for k in ("post, no warmup", "post, 100-step warmup", "pre, no warmup")}
    wl = {k: _loss(v) for k, v in warm.items()}
    depth = {k: _loss(v) for k, v in runs.items() if isinstance(k, tuple) and k[0] != "grid"}
    dyt, ln6, rms6 = (_loss(runs[k]) for k in ("dyt", "ln6", "rms6"))
    grid = {k[1:]: final_loss(v[0]) for k, v in runs.items() if isinstance(k, tuple) and k[0] == "grid"}
    trained = {p: sum(grid[(p, n, lr)] < 0.5 for n in g_depths for lr in g_lrs) for p in GRID_PLACEMENTS}

    claims = [
        claim("5", "Post-LN needs learning-rate warmup; Pre-LN does not", "Xiong et al. 2020, §3.2, §4",
              {"mean final loss": wl}, "L=6, lr 3e-3: Post without warmup > 2.0; Post with 100-step warmup < 0.1; "
              "Pre without warmup < 0.1",
              wl["post, no warmup"] > 2.0 and wl["post, 100-step warmup"] < 0.1 and wl["pre, no warmup"] < 0.1),
        claim("6", "Deep Post-LN fails where Pre-LN and DeepNorm train", "Liu et al. 2020; Wang et al. 2022",
              {f"{p} lr {lr:g}": v for (p, lr), v in depth.items() if p != "admin"},
              f"L={deep}, lr 1e-3 and 3e-3, no warmup: Post > 2.0; Pre and DeepNorm < 0.1",
              all(depth[("post", lr)] > 2.0 and depth[("pre", lr)] < 0.1 and depth[("deepnorm", lr)] < 0.1
                  for lr in (1e-3, 3e-3))),
        claim("9", "Admin's closed-form residual scale lets deep Post-LN train", "Liu et al. 2020 (admin-torch)",
              {"admin lr 1e-3": depth[("admin", 1e-3)]},
              f"L={deep}, lr 1e-3, no warmup: final loss < 0.1", depth[("admin", 1e-3)] < 0.1),
        claim("13", "DyT (gamma tanh(alpha x) + beta, alpha0 = 0.5) trains like LayerNorm on small models",
              "Zhu et al. 2025", {"dyt": dyt, "layernorm": ln6}, "Pre, L=6, lr 1e-3: DyT final loss < 0.05",
              dyt < 0.05),
        claim("12b", "RMSNorm matches LayerNorm's task quality", "Zhang & Sennrich 2019",
              {"rmsnorm": rms6, "layernorm": ln6, "difference": rms6 - ln6},
              "Pre, L=6, lr 1e-3: |loss(RMSNorm) - loss(LayerNorm)| <= 0.01", abs(rms6 - ln6) <= 0.01),
        claim("G1", "Pre-Norm is less sensitive to the learning rate and depth than Post-Norm", "lesson 000",
              {"cells trained (loss < 0.5)": trained, "cells": len(g_depths) * len(g_lrs)},
              "lr x depth grid: Pre trains in more cells than Post", trained["pre"] > trained["post"]),
        claim("G2", "Without a norm, deep models train worse", "lesson 000",
              {"cells trained": {"none": trained["none"], "pre": trained["pre"]}},
              "lr x depth grid: no-norm trains in fewer cells than Pre", trained["none"] < trained["pre"]),
    ]
    return finish(ctx, _plot(warm, grid, g_depths, g_lrs), NAME, TITLE, claims)


def _plot(warm, grid, depths, lrs):
    plt = pyplot()
    fig = plt.figure(figsize=(15, 6))
    ax = fig.add_subplot(2, 5, (1, 6))
    for (label, runs), color in zip(warm.items(), ("C3", "C1", "C0")):
        for i, r in enumerate(runs):
            ys = r.get("curve") or []
            ax.plot([10 * k for k in range(len(ys))], ys, color=color, alpha=0.7, label=label if i == 0 else None)
    ax.axhline(CHANCE, color="gray", ls=":", label="chance ln 32")
    ax.set(xlabel="step", ylabel="training loss", yscale="log", title="Warmup, L=6, lr 3e-3")
    ax.legend(fontsize=7)
    for i, p in enumerate(GRID_PLACEMENTS):
        ax = fig.add_subplot(2, 5, [2, 3, 4, 5, 7, 8, 9][i])
        m = [[min(grid[(p, n, lr)], 5.0) for lr in lrs] for n in depths]
        im = ax.imshow(m, vmin=0, vmax=CHANCE, cmap="viridis_r", aspect="auto")
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.set_yticks(range(len(depths)), depths)
        for (a, b), v in [((a, b), grid[(p, n, lr)]) for a, n in enumerate(depths) for b, lr in enumerate(lrs)]:
            ax.text(b, a, "div" if math.isinf(v) else f"{v:.2f}", ha="center", va="center", fontsize=6,
                    color="w" if v > 1.5 else "k")
        ax.set(title=p, xlabel="learning rate", ylabel="layers")
        ax.grid(False)
    host = fig.add_subplot(2, 5, 10)
    host.axis("off")
    fig.colorbar(im, ax=host, fraction=0.5, label="final loss (div: diverged)")
    return fig
