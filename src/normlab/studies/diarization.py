"""Claims D1, D2: norm placement in the lesson's diarization model, measured by DER.

Lesson 000 puts Pre-Norm blocks in a diarization encoder. Here the same EEND
model is trained with the same data, steps and learning rate (no warmup, so
the placements are compared where they differ most) in three placements:
Pre-LN, Post-LN and no norm at all; each is scored with DER (collar 0.25 s)
on two held-out sets: EEND-style mixtures of synthesizer voices never heard in
training, and, where the recorded prompts of real persons are installed
(``diarization/data/prompts.py``), conversations of two real persons never
heard in training. The threshold and median width are chosen on a dev split
(real persons' conversations when installed). A claim holds only if it holds
on every set. Needs espeak-ng; without it the claims are reported as SKIP.
"""
from __future__ import annotations

import hashlib
import json
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
    from ..diarization.training.recipe import RecipeConfig, TrainingDiverged, score_model, train_model

    data = pathlib.Path(cfg["data"])
    rc = RecipeConfig(**cfg["recipe"], placement=cfg["placement"], norm=cfg["norm"], seed=cfg["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            model, losses = train_model(data, pathlib.Path(tmp), rc)
            final = mean(losses[-20:])
        except TrainingDiverged as e:  # a result, not a failed cell (a rerun would diverge the same way)
            model, losses, final = None, e.losses, e.loss  # the finite steps' losses, the step that diverged
    curve = [mean(losses[i : i + 10]) for i in range(0, len(losses), 10)]  # 10-step means
    if model is None or not math.isfinite(final):
        return {"der": math.inf, "der_collar0": math.inf, "final_loss": final, "losses": curve}
    res = score_model(model, data)
    sets = {name: res[split] for name, split in cfg["sets"].items()}
    return {"der": {k: v["collar_0.25"]["der"] for k, v in sets.items()},
            "der_collar0": {k: v["collar_0"]["der"] for k, v in sets.items()}, "final_loss": final, "losses": curve}


#: the held-out sets a cell is scored on (name in the report -> the recipe's folder), with and without real persons
TEST_SETS = {True: {"synthetic": "test_synth", "real persons": "test"}, False: {"synthetic": "test"}}
SET_TEXT = {"synthetic": "mixtures of unheard synthesizer voices",
            "real persons": "conversations of two unheard real persons"}


def real_persons() -> bool:
    """Whether the recorded prompts of the train, dev and test persons are installed (then dev and one test
    set are real persons' conversations)."""
    from ..diarization.data.prompts import installed

    return all(installed(split) for split in ("train", "dev", "test"))


def _recipe(ctx: Context, real: bool) -> dict:
    """The study's data and training, every set size stated (the recipe's own defaults are the shipped model's).

    With real persons, the shipped recipe's data scaled down: conversations of synthesizer voices and the train
    persons, and 2.5 times as many conversations of the train persons alone (the recipe's 400 and 1000); tune
    on the dev persons' conversations, score on the test persons' conversations and on synthesizer mixtures.
    Without them, every set is synthesizer voices (``test`` is then the synthetic set)."""
    # full: 5 seeds, twice the steps and 2.5x the training mixtures of quick, 2.5x the test mixtures, the same
    # model (about 25 CPU minutes; at 1500 steps, d_model 128 and 500-frame windows it was ~8 CPU hours)
    n_test = ctx.pick(2, 8, 20)
    n_train = ctx.pick(6, 40, 100)
    none = dict.fromkeys(("n_train_synth", "n_dev_mixed", "n_dev_synth", "n_test_mixed", "n_test_dry",
                          "n_flite", "n_train_reverb", "n_test_reverb", "n_train_stretch", "n_train_nonspeech",
                          "n_dev_stretch", "n_test_stretch", "finetune_steps"), 0)
    return {**none, "sources": "mixed" if real else "all", "n_train": n_train,
            "n_train_real": round(2.5 * n_train) if real else 0,
            "n_dev": ctx.pick(2, 6, 12), "n_test": n_test, "n_test_synth": n_test if real else 0,
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


def no_worse(der: float, other: float, margin: float) -> bool:
    """D1's test: a mean DER within ``margin`` of another's, and finite: a diverged run (mean inf) is no better
    than anything, not even another diverged one (``inf <= inf`` would pass it)."""
    return math.isfinite(der) and der <= other + margin


def worse(der: float, other: float, margin: float) -> bool:
    """D2's test: a mean DER above another's by more than ``margin``. A diverged run (mean inf) is worse than
    any finite one; nothing is worse than a diverged ``other``."""
    return math.isfinite(other) and der > other + margin


def data_folder(out: pathlib.Path, scale: str, real: bool, recipe: dict) -> pathlib.Path:
    """Where the study's conversations are simulated: one folder per recipe. A folder simulated for another
    recipe keeps the mixtures it has (a simulation resumes and grows, it never removes), and every mixture
    found is read, so a recipe with fewer conversations would train and score on the old, larger set."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    return out / "diarization-data" / f"{scale}-{'real' if real else 'synthetic'}-{digest}"


def run(ctx: Context) -> dict:
    if shutil.which("espeak-ng") is None:
        return _skipped("espeak-ng is not installed: no speech to simulate")
    from ..diarization.data.dataset import MixtureSet
    from ..diarization.training.recipe import RecipeConfig, simulate_splits

    real = real_persons()
    sets, recipe = TEST_SETS[real], _recipe(ctx, real)
    data = data_folder(ctx.folder, ctx.scale, real, recipe)
    simulate_splits(data, RecipeConfig(**recipe), jobs=ctx.runner.jobs)  # the same data for every cell
    for split in ("train", "dev", *sets.values()):  # feature caches written once, here, before the cells read them
        MixtureSet(data / split, n_speakers=RecipeConfig(**recipe).n_speakers)
    # the folder as one absolute path: keyed as typed, --out rep and --out /abs/rep recomputed every cell
    configs = {(name, s): {"placement": p, "norm": n, "seed": s, "data": str(data.resolve()), "recipe": recipe,
                           "sets": sets}
               for name, (p, n) in PLACEMENTS.items() for s in ctx.seeds}
    results = dict(zip(configs, ctx.runner.map(NAME, der_cell, list(configs.values()))))

    def per_seed(key: str, name: str, test: str) -> list[float]:
        return [results[(name, s)][key][test] if isinstance(results[(name, s)].get(key), dict) else math.inf
                for s in ctx.seeds]  # a diverged cell has no per-set scores: inf on every set

    ders = {t: {name: per_seed("der", name, t) for name in PLACEMENTS} for t in sets}
    m = {t: {name: mean(v) for name, v in d.items()} for t, d in ders.items()}
    measured = {"mean DER": m, "DER per seed": ders,
                "mean DER collar 0": {t: {name: mean(per_seed("der_collar0", name, t)) for name in PLACEMENTS}
                                      for t in sets},
                "test sets": {t: f"{recipe['n_test']} {SET_TEXT[t]}" for t in sets}}
    (d1, t1, c1), (d2, t2, c2) = CLAIMS
    seeds_note = "; ".join(f"{t} per-seed DER: " + ", ".join(spread(name, ders[t][name]) for name in PLACEMENTS)
                           for t in sets)
    claims = [claim(d1, t1, "lesson 000", measured, c1,
                    all(no_worse(m[t]["pre"], m[t]["post"], c1["margin"] / 100) for t in sets), seeds_note),
              claim(d2, t2, "lesson 000", measured, c2,
                    all(worse(m[t]["none"], m[t]["pre"], c2["margin"] / 100) for t in sets), seeds_note)]
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.2))
    width = 0.8 / len(sets)
    for j, t in enumerate(sets):
        for i, name in enumerate(PLACEMENTS):
            x = i + (j - (len(sets) - 1) / 2) * width
            finite = [100 * v for v in ders[t][name] if math.isfinite(v)]
            ax.bar(x, 100 * m[t][name] if math.isfinite(m[t][name]) else 0, width, color=f"C{i}",
                   alpha=0.6 if j == 0 else 0.3, hatch=None if j == 0 else "//", label=t if i == 0 else None)
            ax.scatter([x] * len(finite), finite, color="k", s=10, zorder=3)
    for i, name in enumerate(PLACEMENTS):
        for s in ctx.seeds:
            losses = results[(name, s)].get("losses", [])
            bx.plot([10 * k for k in range(len(losses))], losses, color=f"C{i}", alpha=0.7,
                    label=name if s == ctx.seeds[0] else None)
    ax.set_xticks(range(len(PLACEMENTS)), list(PLACEMENTS))
    ax.set(ylabel="test DER, %, collar 0.25 s", title="DER by placement (bars: mean, dots: seeds)")
    ax.legend(fontsize=7)
    bx.set(xlabel="step", ylabel="PIT BCE loss (10-step mean)", title="training loss", yscale="log")
    bx.legend()
    result = finish(ctx, fig, NAME, TITLE, claims)
    pct = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    result["table"] = {"columns": ["test set", "placement", "mean DER, collar 0.25 s", "mean DER, collar 0",
                                   "DER per seed"],
                       "rows": [[t, name, pct(m[t][name]), pct(measured["mean DER collar 0"][t][name]),
                                 ", ".join(pct(v) for v in ders[t][name])] for t in sets for name in PLACEMENTS]}
    return result
