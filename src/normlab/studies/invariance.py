"""Ba et al. 2016, Table 1: what LayerNorm (and RMSNorm, ScaleNorm) is invariant to."""
from __future__ import annotations

import torch

from .. import functional as F
from ..norms import ScaleNorm
from .base import Context, claim, finish, pyplot
from .criteria import CRITERIA

NAME, TITLE = "invariance", "Invariances (Ba et al. 2016, Table 1)"


def invariance_cell(cfg: dict) -> dict:
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randn(64, 32, generator=g, dtype=torch.float64)  # N, D_in
    W = torch.randn(32, 48, generator=g, dtype=torch.float64)  # D_in, D
    # Ba et al.'s columns, on h = x W: a single example re-scaled (each row by its own a_n > 0) or shifted (its
    # own c_n on every unit), the weight matrix re-scaled or re-centered (the same vector v added to every
    # unit's incoming weights), and half the units' weight vectors re-scaled (LayerNorm is not invariant to that)
    a = torch.rand(64, 1, generator=g, dtype=torch.float64) * 4 + 0.25
    c = torch.randn(64, 1, generator=g, dtype=torch.float64) * 3
    v = torch.randn(32, 1, generator=g, dtype=torch.float64)
    units = torch.ones(48, dtype=torch.float64)
    units[::2] = 3.7  # every other unit's weight vector
    h = x @ W  # N, D
    sn = ScaleNorm(48).double()
    norms = {
        "layernorm": lambda t: F.layer_norm(t, 48, eps=0.0),
        "rmsnorm": lambda t: F.rms_norm(t, 48, eps=0.0),
        "scalenorm": lambda t: sn(t).detach(),
    }
    transforms = {
        "example_scale": a * h,
        "example_shift": h + c,
        "weight_rescale": x @ (3.7 * W),
        "weight_recenter": x @ (W + v),
        "unit_rescale": x @ (W * units),
    }
    return {"deviation": {n: {t: (f(ht) - f(h)).abs().max().item() for t, ht in transforms.items()}
                          for n, f in norms.items()}}


def run(ctx: Context) -> dict:
    r = ctx.runner.map(NAME, invariance_cell, [{"seed": 0}])[0]["deviation"]
    crit = CRITERIA["1"]
    tol, moved = crit["tol"], crit["moved"]
    ln, rms, sn = r["layernorm"], r["rmsnorm"], r["scalenorm"]
    claims = [
        claim("1", "LayerNorm is invariant to per-example shift and scale and to weight-matrix re-scaling and "
                   "re-centering; RMSNorm is not shift-invariant", "Ba et al. 2016, Table 1",
              {"max deviation": r}, crit,
              all(v < tol for t, v in ln.items() if t != "unit_rescale") and ln["unit_rescale"] > moved
              and all(n["example_scale"] < tol and n["weight_rescale"] < tol for n in (rms, sn))
              and all(n["example_shift"] > moved and n["weight_recenter"] > moved for n in (rms, sn)),
              "none: float64, deterministic (seed 0); the deviations are rounding, not sampling"),
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    names, ts = list(r), list(ln)
    for i, n in enumerate(names):
        ax.bar([j + 0.27 * i for j in range(len(ts))], [max(r[n][t], 1e-17) for t in ts], width=0.27, label=n)
    ax.set_xticks([j + 0.27 for j in range(len(ts))], [t.replace("_", " ") for t in ts])
    ax.axhline(tol, color="k", ls="--", lw=1, label=f"{tol:g} (invariant below)")
    ax.set(yscale="log", ylabel="max |N(T(h)) - N(h)| (float64)", title="Which transforms each norm ignores")
    ax.legend(fontsize=7)
    return finish(ctx, fig, NAME, TITLE, claims)
