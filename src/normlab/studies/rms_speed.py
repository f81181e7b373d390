"""Claim 12a: RMSNorm is cheaper than LayerNorm, like for like (Zhang & Sennrich 2019)."""
from __future__ import annotations

import os
import time

import torch

from .. import provenance, reference
from .base import Context, claim, finish, pyplot
from .criteria import CRITERIA

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

    times: dict[str, list[float]] = {"layernorm": [], "rmsnorm": []}
    for _ in range(2):  # warm-up
        ln(), rms()
    for i in range(cfg["repeats"]):
        for name, fn in (("layernorm", ln), ("rmsnorm", rms)) if i % 2 == 0 else (("rmsnorm", rms), ("layernorm", ln)):
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {"ms": {k: min(v) for k, v in times.items()}, "ms_per_repeat": times}


def run(ctx: Context) -> dict:
    crit = CRITERIA["12a"]
    # a timing holds for the machine and the moment that made it: the CPU and the run are in the cell's key, so
    # every run of the study times again (a few seconds) instead of reading back a timing taken under load, or
    # on another machine, for good
    cfg = {"n": crit["n"], "d": crit["d"], "repeats": crit["repeats"], "seed": 0,
           "machine": f"{provenance.cpu_name()} x{os.cpu_count()}", "run": ctx.runner.run_id}
    r = ctx.runner.map(NAME, speed_cell, [cfg])[0]
    ms = r["ms"]
    ratio = ms["rmsnorm"] / ms["layernorm"]
    per_repeat = [a / b for a, b in zip(r["ms_per_repeat"]["rmsnorm"], r["ms_per_repeat"]["layernorm"])]
    claims = [
        claim("12a", "RMSNorm is cheaper than LayerNorm: 7%-64% less time", "Zhang & Sennrich 2019",
              {"ms": ms, "rms/ln": ratio}, crit, ratio <= crit["max"],
              f"rms/ln per repeat {min(per_repeat):.3g} to {max(per_repeat):.3g} ({len(per_repeat)} repeats; "
              "timing, not seeds)"),
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(list(ms), list(ms.values()), color=["C0", "C1"])
    ax.set(ylabel="ms, forward+backward (best of repeats)", title=f"Reference implementations, ratio {ratio:.2f}")
    return finish(ctx, fig, NAME, TITLE, claims)
