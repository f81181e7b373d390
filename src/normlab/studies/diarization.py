"""Claims D1, D2: norm placement in the lesson's diarization model, measured by DER.

Lesson 000 puts Pre-Norm blocks in a diarization encoder. Here the same EEND
model is trained with the same data, steps and learning rate (no warmup, so
the placements are compared where they differ most) in three placements:
Pre-LN, Post-LN and no norm at all; each is scored with DER (collar 0.25 s)
on mixtures of voices never heard in training, its threshold and median
width chosen on a dev split. Needs espeak-ng; without it the claims are
reported as SKIP.
"""
from __future__ import annotations

import math
import pathlib
import shutil
import tempfile

from .base import Context, claim, finish, mean, pyplot, spread
from .criteria import CRITERIA

NAME, TITLE = "diarization", "Norm placement in a diarization model: DER with the same budget (lesson 000)"
PLACEMENTS = {"pre": ("pre", "layernorm"), "post": ("post", "layernorm"), "none": ("pre", "none")}


def der_cell(cfg: dict) -> dict:
    """Train one placement on ``cfg["data"]`` and score it; a diverged run reads DER = inf."""
    from ..diarization.training.recipe import RecipeConfig, score_model, train_model

    data = pathlib.Path(cfg["data"])
    rc = RecipeConfig(**cfg["recipe"], placement=cfg["placement"], norm=cfg["norm"], seed=cfg["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        model, losses = train_model(data, pathlib.Path(tmp), rc)
    final = mean(losses[-20:])
    curve = [mean(losses[i : i + 10]) for i in range(0, len(losses), 10)]  # 10-step means
    if not math.isfinite(final):
        return {"der": math.inf, "der_collar0": math.inf, "final_loss": final, "losses": curve}
    res = score_model(model, data)
    return {"der": res["test"]["collar_0.25"]["der"], "der_collar0": res["test"]["collar_0"]["der"],
            "final_loss": final, "losses": curve}


def _recipe(ctx: Context) -> dict:
    # full: 5 seeds, twice the steps and 2.5x the training mixtures of quick, 2.5x the test mixtures, the same
    # model (about 25 CPU minutes; at 1500 steps, d_model 128 and 500-frame windows it was ~8 CPU hours)
    return {"n_train": ctx.pick(6, 40, 100), "n_dev": ctx.pick(2, 6, 12), "n_test": ctx.pick(2, 8, 20), "n_flite": 0,
            "n_train_reverb": 0, "n_test_reverb": 0,
            "steps": ctx.pick(20, 300, 600), "warmup": 0, "decay": "none", "lr": 1e-3, "batch": 8,
            "frames": ctx.pick(100, 200, 200), "d_model": ctx.pick(32, 64, 64), "n_layers": 4, "n_heads": 4}


def _skipped(reason: str) -> dict:
    rows = [claim(cid, text, "lesson 000", {"reason": reason}, crit, None) for cid, text, crit in CLAIMS]
    return {"name": NAME, "title": TITLE, "claims": rows, "figure": None}


CLAIMS = [
    ("D1", "In the diarization encoder, Pre-LN reaches a DER no worse than Post-LN with the same budget",
     CRITERIA["D1"]),
    ("D2", "Removing the norms makes the diarization encoder worse", CRITERIA["D2"]),
]


def run(ctx: Context) -> dict:
    if shutil.which("espeak-ng") is None:
        return _skipped("espeak-ng is not installed: no speech to simulate")
    from ..diarization.data.dataset import MixtureSet
    from ..diarization.training.recipe import RecipeConfig, simulate_splits

    data = ctx.out.parent / "diarization-data" / ctx.scale
    simulate_splits(data, RecipeConfig(**_recipe(ctx)), jobs=ctx.runner.jobs)  # the same data for every cell
    for split in ("train", "dev", "test"):
        MixtureSet(data / split)  # feature caches written once, here, before the cells read them
    configs = {(name, s): {"placement": p, "norm": n, "seed": s, "data": str(data), "recipe": _recipe(ctx)}
               for name, (p, n) in PLACEMENTS.items() for s in ctx.seeds}
    results = dict(zip(configs, ctx.runner.map(NAME, der_cell, list(configs.values()))))
    ders = {name: [results[(name, s)].get("der", math.inf) for s in ctx.seeds] for name in PLACEMENTS}
    der0 = {name: [results[(name, s)].get("der_collar0", math.inf) for s in ctx.seeds] for name in PLACEMENTS}
    m = {name: mean(v) for name, v in ders.items()}
    measured = {"mean DER": m, "DER per seed": ders, "mean DER collar 0": {k: mean(v) for k, v in der0.items()}}
    (d1, t1, c1), (d2, t2, c2) = CLAIMS
    seeds_note = "per-seed DER: " + "; ".join(spread(name, ders[name]) for name in PLACEMENTS)
    claims = [claim(d1, t1, "lesson 000", measured, c1, m["pre"] <= m["post"] + c1["margin"] / 100, seeds_note),
              claim(d2, t2, "lesson 000", measured, c2, m["none"] > m["pre"], seeds_note)]
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.2))
    for i, name in enumerate(PLACEMENTS):
        finite = [100 * v for v in ders[name] if math.isfinite(v)]
        ax.bar(i, 100 * m[name] if math.isfinite(m[name]) else 0, color=f"C{i}", alpha=0.6)
        ax.scatter([i] * len(finite), finite, color="k", s=10, zorder=3)
        for s in ctx.seeds:
            losses = results[(name, s)].get("losses", [])
            bx.plot([10 * k for k in range(len(losses))], losses, color=f"C{i}", alpha=0.7,
                    label=name if s == ctx.seeds[0] else None)
    ax.set_xticks(range(len(PLACEMENTS)), list(PLACEMENTS))
    ax.set(ylabel="test DER, %, collar 0.25 s", title="DER by placement (bars: mean, dots: seeds)")
    bx.set(xlabel="step", ylabel="PIT BCE loss (10-step mean)", title="training loss", yscale="log")
    bx.legend()
    result = finish(ctx, fig, NAME, TITLE, claims)
    pct = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    result["table"] = {"columns": ["placement", "mean DER, collar 0.25 s", "mean DER, collar 0", "DER per seed"],
                       "rows": [[name, pct(m[name]), pct(mean(der0[name])), ", ".join(pct(v) for v in ders[name])]
                                for name in PLACEMENTS]}
    return result
