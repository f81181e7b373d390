"""``normlab bench --dispatch``: what ``auto`` runs for each case on this machine, and why.

For every (op, shape, dtype) of the grid it asks the dispatcher for its
decision (:func:`normlab.kernels.decide`): a key met for the first time is
measured then and there (:mod:`normlab.kernels.autotune`), so the table also
shows what measuring cost; a key decided before, in this process or saved in
the cache, is shown as it was decided.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .. import kernels
from .._checks import acc_dtype
from ..kernels import autotune
from ..kernels.base import OP_SPECS
from .bench import DTYPES, OPS, SHAPES, machine


def run(ops=OPS, shapes=SHAPES, dtypes=DTYPES, progress: Callable | None = None) -> dict:
    rows = []
    grid = [(o, s, d, m) for o in ops for s in shapes for d in dtypes for m in ("train", "fwd")]
    for i, (op, (n, d), dtype, mode) in enumerate(grid):
        x = torch.empty(n, d, dtype=getattr(torch, dtype))  # only its dtype, device and shape are looked at
        eps = torch.finfo(acc_dtype(x.dtype)).eps if OP_SPECS[op].rms else 1e-5
        with torch.set_grad_enabled(mode == "train"):  # training and inference are decided apart
            dec, k = kernels.decide("auto", op, x, eps), autotune.key(op, x, d)
        rows.append({"op": op, "shape": f"{n}x{d}", "dtype": dtype, "mode": mode, "key": k, "impl": dec.impl,
                     "why": dec.why, "ms": dec.ms, "sample": dec.sample, "cost_ms": dec.cost_ms})
        if progress:  # decision i is made (counted from 0)
            progress(i, len(grid), f"{op} {n}x{d} {dtype} {mode}")
    return {"machine": machine(), "autotune": autotune.enabled(), "cache": str(autotune.TUNER.path),
            "unsaved": autotune.TUNER.unsaved, "rows": rows}


def markdown(result: dict) -> str:
    state = "on" if result["autotune"] else "off (NORMLAB_AUTOTUNE=0 or set_autotune(False))"
    lines = [f"Dispatch on {result['machine']['cpu']}, {result['machine']['threads']} threads: autotune {state}; "
             + ("the fixed table decides; no decision is read or saved." if not result["autotune"] else
                f"decisions not saved ({result['unsaved']}): they held for that process only." if result.get("unsaved")
                else f"decisions cached in {result['cache']}."), "",
             "| op | shape | dtype | mode | runs | why | candidates: ms on the sample (train: fwd+bwd, fwd: forward) "
             "| sample | measuring cost ms |",
             "|---|---|---|---|---|---|---|---|---:|"]
    for r in result["rows"]:
        cands = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["ms"].items(), key=lambda kv: kv[1])) or "-"
        cost = f"{r['cost_ms']:.1f}" if r["cost_ms"] else "-"
        lines.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r.get('mode', 'train')} | {r['impl']} | {r['why']} "
                     f"| {cands} "
                     f"| {r['sample'] or '-'} | {cost} |")
    return "\n".join(lines)
