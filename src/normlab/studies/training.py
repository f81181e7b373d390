"""Training claims: warmup (5), deep Post-LN (6), Admin (9), DyT (13), RMSNorm quality (12b), the lr x depth grid.

Every claim uses ``ctx.seeds`` seeds (3 quick, 5 full) of the final loss (mean
of the last 20 steps); a diverged run counts as infinite loss. Claim 5 runs a
ReLU feed-forward (Xiong et al.'s analysis and fairseq's default) and decides
each condition by the majority of seeds; G1 and G2 count a grid cell as
trained when the majority of its seeds train. Each claim prints its per-seed
spread.
"""
from __future__ import annotations

import math

from .base import Context, claim, finish, mean, pyplot, spread
from .criteria import CRITERIA
from .task import CHANCE, final_loss, train_cell

NAME, TITLE = "training", "Training stability: warmup, depth, learning rate (Xiong, Liu, DeepNet, Zhu)"
GRID_PLACEMENTS = ("none", "post", "pre", "sandwich", "deepnorm", "admin", "mixln")
COUNTED = ("none", "post", "pre")  # the grid placements G1 and G2 compare: every seed; the others (full) seed 0


def _seeded(ctx, steps, **cfg) -> list[dict]:
    return [{"steps": steps, "warmup": 0, "norm": "layernorm", **cfg, "seed": s} for s in ctx.seeds]


def _loss(runs) -> float:
    return mean(final_loss(r) for r in runs)


def _losses(runs) -> list[float]:
    return [final_loss(r) for r in runs]


def _majority(runs, ok) -> bool:
    return 2 * sum(bool(ok(final_loss(r))) for r in runs) > len(runs)


def run(ctx: Context) -> dict:
    steps = ctx.pick(160, 300, 300)  # at test size: just past the plateau that precedes learning at lr 1e-3
    deep = ctx.pick(6, 12, 12)
    g_depths = ctx.pick([2, 6], [2, 6], [2, 6, 12, 24])  # quick: 3 seeds of the 3 compared placements fit 10 min
    # quick: 150 steps, where lr 1e-4 trains nothing (at 1e-3 the plateau alone lasts ~140 steps); the full grid
    # has every depth, learning rate and all seven placements, quick and test the three that G1 and G2 compare
    g_lrs = ctx.pick([1e-3, 1e-2], [1e-3, 1e-2], [1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    g_steps = ctx.pick(60, 150, 300)
    g_places = ctx.pick(COUNTED, COUNTED, GRID_PLACEMENTS)
    c5, c6, c9, c13, c12b, cg1, cg2 = (CRITERIA[k] for k in ("5", "6", "9", "13", "12b", "G1", "G2"))
    c5, c6, c9 = c5.at(steps=steps), c6.at(layers=deep), c9.at(layers=deep)
    relu = {"placement": "pre", "layers": 6, "lr": 3e-3, "activation": "relu"}
    groups: dict = {
        "post, no warmup": _seeded(ctx, steps, **{**relu, "placement": "post"}),
        "post, 100-step warmup": _seeded(ctx, steps, **{**relu, "placement": "post"}, warmup=c5["warmup"]),
        "pre, no warmup": _seeded(ctx, steps, **relu),
        "dyt": _seeded(ctx, steps, placement="pre", norm="dyt", layers=6, lr=1e-3),
        "ln6": _seeded(ctx, steps, placement="pre", layers=6, lr=1e-3),
        "rms6": _seeded(ctx, steps, placement="pre", norm="rmsnorm", layers=6, lr=1e-3),
    }
    for p, lr in [("post", 1e-3), ("post", 3e-3), ("pre", 1e-3), ("pre", 3e-3), ("deepnorm", 1e-3),
                  ("deepnorm", 3e-3), ("admin", 1e-3)]:
        groups[(p, lr)] = _seeded(ctx, steps, placement=p, layers=deep, lr=lr)
    for p in g_places:  # "none": a pre stack whose norms are the identity
        for n in g_depths:
            for lr in g_lrs:
                groups[("grid", p, n, lr)] = [{"placement": "pre" if p == "none" else p,
                                               "norm": "none" if p == "none" else "layernorm", "layers": n,
                                               "lr": lr, "steps": g_steps, "warmup": 0, "seed": s}
                                              for s in (ctx.seeds if p in COUNTED else ctx.seeds[:1])]
    flat = [c for cfgs in groups.values() for c in cfgs]  # one map: every cell in parallel
    results = iter(ctx.runner.map(NAME, train_cell, flat))
    runs = {k: [next(results) for _ in cfgs] for k, cfgs in groups.items()}

    warm = {k: runs[k] for k in ("post, no warmup", "post, 100-step warmup", "pre, no warmup")}
    wl = {k: _loss(v) for k, v in warm.items()}
    w_ok = {"post, no warmup": _majority(warm["post, no warmup"], lambda v: v > c5["post_fail"]),
            "post, 100-step warmup": _majority(warm["post, 100-step warmup"], lambda v: v < c5["trained"]),
            "pre, no warmup": _majority(warm["pre, no warmup"], lambda v: v < c5["trained"])}
    depth = {k: _loss(v) for k, v in runs.items() if isinstance(k, tuple) and k[0] != "grid"}
    # "Post-LN fails" by the majority of seeds (one diverged seed makes a mean infinite: it would decide alone)
    post_fails = {lr: _majority(runs[("post", lr)], lambda v: v > c6["post_fail"]) for lr in (1e-3, 3e-3)}
    post_fails_9 = _majority(runs[("post", 1e-3)], lambda v: v > c9["post_fail"])  # claim 9's own limit
    dyt, ln6, rms6 = (_loss(runs[k]) for k in ("dyt", "ln6", "rms6"))
    cells = {k[1:]: v for k, v in runs.items() if isinstance(k, tuple) and k[0] == "grid"}
    grid = {k: _loss(v) for k, v in cells.items()}

    def trained_cells(places, limit):  # per placement: the grid cells a majority of seeds train in (loss < limit)
        return {p: sum(_majority(cells[(p, n, lr)], lambda x: x < limit) for n in g_depths for lr in g_lrs)
                for p in places}

    def per_seed_trained(places, limit):
        return {p: [sum(final_loss(cells[(p, n, lr)][i]) < limit for n in g_depths for lr in g_lrs)
                    for i in range(len(ctx.seeds))] for p in places}

    trained = trained_cells(g_places, cg1["trained"])  # G1's counts: every placement of the grid
    trained_g2 = trained_cells(("none", "pre"), cg2["trained"])
    seeds_g1, seeds_g2 = per_seed_trained(("pre", "post"), cg1["trained"]), per_seed_trained(("none", "pre"),
                                                                                              cg2["trained"])
    n_cells = len(g_depths) * len(g_lrs)

    def seeds_of(*keys):
        return "; ".join(spread(k if isinstance(k, str) else f"{k[0]} lr {k[1]:g}", _losses(runs[k])) for k in keys)

    claims = [
        claim("5", "Post-LN needs learning-rate warmup; Pre-LN does not", "Xiong et al. 2020, §3.2, §4",
              {"mean final loss": wl, "final loss per seed": {k: _losses(v) for k, v in warm.items()},
               "condition holds in a majority of seeds": w_ok}, c5, all(w_ok.values()),
              "per-seed final loss: " + seeds_of(*warm)),
        claim("6", "Deep Post-LN fails where Pre-LN and DeepNorm train", "Liu et al. 2020; Wang et al. 2022",
              {**{f"{p} lr {lr:g}": v for (p, lr), v in depth.items() if p != "admin"},
               "post fails in a majority of seeds": {f"lr {lr:g}": v for lr, v in post_fails.items()}}, c6,
              all(post_fails[lr] and depth[("pre", lr)] < c6["trained"]
                  and depth[("deepnorm", lr)] < c6["trained"] for lr in (1e-3, 3e-3)),
              "per-seed final loss: "
              + seeds_of(*[(p, lr) for p in ("post", "pre", "deepnorm") for lr in (1e-3, 3e-3)])),
        claim("9", "Admin's closed-form residual scale lets deep Post-LN train", "Liu et al. 2020 (admin-torch)",
              {"admin lr 1e-3": depth[("admin", 1e-3)], "post lr 1e-3": depth[("post", 1e-3)],
               "post fails in a majority of seeds": post_fails_9}, c9,
              depth[("admin", 1e-3)] < c9["trained"] and post_fails_9,
              "per-seed final loss: " + seeds_of(("admin", 1e-3), ("post", 1e-3))),
        claim("13", "DyT (gamma tanh(alpha x) + beta, alpha0 = 0.5) trains like LayerNorm on small models",
              "Zhu et al. 2025", {"dyt": dyt, "layernorm": ln6}, CRITERIA["13"], dyt < c13["max"],
              "per-seed final loss: " + seeds_of("dyt", "ln6")),
        claim("12b", "RMSNorm matches LayerNorm's task quality", "Zhang & Sennrich 2019",
              {"rmsnorm": rms6, "layernorm": ln6, "difference": rms6 - ln6}, c12b, abs(rms6 - ln6) <= c12b["max"],
              spread("per-seed difference rms - ln", [a - b for a, b in zip(_losses(runs["rms6"]),
                                                                          _losses(runs["ln6"]))])),
        claim("G1", "Pre-Norm is less sensitive to the learning rate and depth than Post-Norm", "lesson 000",
              {"cells trained (majority of seeds)": trained, "cells": n_cells}, cg1, trained["pre"] > trained["post"],
              "cells trained per seed: " + "; ".join(f"{p} {v}" for p, v in seeds_g1.items())),
        claim("G2", "Without a norm, deep models train worse", "lesson 000",
              {"cells trained (majority of seeds)": trained_g2, "cells": n_cells,
               f"mean final loss at L={g_depths[-1]}": {p: {f"lr {lr:g}": grid[(p, g_depths[-1], lr)] for lr in g_lrs}
                                                       for p in ("none", "pre")}},
              cg2, trained_g2["none"] < trained_g2["pre"],
              "cells trained per seed: " + "; ".join(f"{p} {v}" for p, v in seeds_g2.items())),
    ]
    return finish(ctx, _plot(warm, grid, g_places, g_depths, g_lrs), NAME, TITLE, claims)


def _plot(warm, grid, places, depths, lrs):
    plt = pyplot()
    fig = plt.figure(figsize=(15, 6))
    ax = fig.add_subplot(2, 5, (1, 6))
    for (label, runs), color in zip(warm.items(), ("C3", "C1", "C0")):
        for i, r in enumerate(runs):
            ys = r.get("curve") or []
            ax.plot([10 * k for k in range(len(ys))], ys, color=color, alpha=0.7, label=label if i == 0 else None)
    ax.axhline(CHANCE, color="gray", ls=":", label="chance ln 32")
    ax.set(xlabel="step", ylabel="training loss", yscale="log", title="Warmup, L=6, ReLU, lr 3e-3")
    ax.legend(fontsize=7)
    for i, p in enumerate(places):
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
