"""Where a training step's time goes: ``normlab bench --model --profile``.

``torch.profiler`` records a few training steps (forward, loss, backward,
``AdamW.step()``, ``zero_grad``) of the model bench's encoders; each op's
*self* CPU time (its own time, children excluded, so nothing is counted
twice) goes to one bucket: optimizer for everything under ``Optimizer.*``,
else by its name or the nearest enclosing op's: GEMMs, attention (softmax,
masking, the fused attention kernels), norms and adds (normlab's kernels,
torch's LayerNorm, additions), activation, other.
"""
from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable

import torch
from torch import nn

BUCKETS = ("GEMMs", "attention", "norms and adds", "activation", "optimizer", "other")

#: name fragments (lower case) per bucket, tried in this order
_PATTERNS = (
    ("optimizer", ("_foreach", "adam", "optimizer.", "lerp", "addcdiv", "addcmul")),
    ("GEMMs", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "mkldnn",
               "aten::_addmm")),
    ("attention", ("softmax", "scaled_dot_product", "flash_attention", "_efficient_attention", "masked_fill")),
    ("norms and adds", ("normfunction", "layer_norm", "rms_norm", "aten::add", "aten::sub")),
    ("activation", ("relu", "gelu", "threshold_backward", "silu", "sigmoid", "tanh", "glu")),
)


def bucket(name: str) -> str:
    low = name.lower()
    for label, frags in _PATTERNS:
        if any(f in low for f in frags):
            return label
    return "other"


def event_bucket(event) -> str:
    """An op's bucket in context: everything under ``Optimizer.step``/``zero_grad`` is the optimizer's (its
    ``sqrt``, ``mul_``, ``add_``); otherwise the op's own name, else that of the nearest enclosing op that
    has a bucket (the ``copy_`` inside a norm call is the norm's)."""
    chain, e = [], event
    while e is not None:
        chain.append(e.name)
        e = e.cpu_parent
    if any(n.startswith("Optimizer.") for n in chain):
        return "optimizer"
    for n in chain:
        b = bucket(n)
        if b != "other":
            return b
    return "other"


def split(step: Callable[[], None], steps: int = 3, warmup: int = 1) -> dict:
    """Milliseconds per step in each bucket (self CPU time), and the largest ops left in "other"."""
    for _ in range(warmup):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ms: dict[str, float] = collections.defaultdict(float)
    other: dict[str, float] = collections.defaultdict(float)
    for e in prof.events():
        b = event_bucket(e)
        ms[b] += e.self_cpu_time_total / 1e3 / steps
        if b == "other":
            other[e.name] += e.self_cpu_time_total / 1e3 / steps
    top = sorted(other.items(), key=lambda kv: -kv[1])[:5]
    return {"ms": {b: round(ms.get(b, 0.0), 2) for b in BUCKETS}, "steps": steps,
            "other_top": {k: round(v, 2) for k, v in top}}


def run(models: dict[str, tuple[nn.Module, Callable]], make_step: Callable, steps: int = 3) -> dict:
    """The split of each model's training step; ``make_step(model, ctx)`` builds the step."""
    out = {}
    for name, (model, ctx) in models.items():
        model.train()
        out[name] = split(make_step(model, ctx or contextlib.nullcontext), steps=steps)
    return out


def markdown(result: dict) -> str:
    names = list(result)
    lines = ["Training step split (self CPU time per step, torch.profiler, "
             f"{result[names[0]]['steps']} steps):", "",
             "| part | " + " | ".join(f"{n} ms | {n} %" for n in names) + " |",
             "|---|" + "---:|---:|" * len(names)]
    totals = {n: sum(result[n]["ms"].values()) or 1.0 for n in names}
    for b in BUCKETS:
        cells = " | ".join(f"{result[n]['ms'][b]:.1f} | {100 * result[n]['ms'][b] / totals[n]:.0f}%" for n in names)
        lines.append(f"| {b} | {cells} |")
    lines.append("| total | " + " | ".join(f"{totals[n]:.1f} | 100%" for n in names) + " |")
    for n in names:
        if result[n]["other_top"]:
            top = result[n]["other_top"]
            lines.append(f"\n{n}, largest in other: " + ", ".join(f"{k} {v:.1f} ms" for k, v in top.items()))
    return "\n".join(lines)
