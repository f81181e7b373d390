"""``normlab bench``'s figures: what the table says, drawn (PNG beside ``bench.md``; needs matplotlib).

* the norms' table: each case's speed against torch (torch's time over normlab's, log scale, 1 = as fast)
  and its share of the same run's memory-copy floor, forward and forward+backward in two colours;
* ``--model``: the encoder's training step and inference time per model, each round's median as a dot;
* ``--dispatch``: each case's candidates' times on their sample, the one ``auto`` runs filled.
"""
from __future__ import annotations

import os

from .._checks import MissingDependency
from ..plotting import pyplot
from ..provenance import describe, png_metadata

MODE_COLOURS = {"fwd": "#4477aa", "fwd+bwd": "#ee6677"}


def draw(kind: str, result: dict, path: str | os.PathLike) -> bool:
    """Draw ``result`` (of :func:`normlab.lab.bench_files.measure`) to ``path``; False where there is nothing to
    draw (no CPU rows) or no matplotlib (the table and the JSON still say it all)."""
    try:
        plt = pyplot("bench figures")
    except MissingDependency:
        return False
    fig = {"norms": _norms, "model": _model, "dispatch": _dispatch}[kind](plt, result)
    if fig is None:
        return False
    prov = result.get("provenance") or {}
    fig.suptitle(f"normlab bench: {describe(prov)}" if prov else "normlab bench", fontsize=8, x=0.01, ha="left")
    fig.savefig(path, dpi=100, bbox_inches="tight", format="png",
                metadata=png_metadata(prov or None, Title=f"normlab bench ({kind})"))
    plt.close(fig)
    return True


def _labels(rows: list[dict], *keys: str) -> list[str]:
    return [" ".join(str(r[k]) for k in keys) for r in rows]


def _norms(plt, result: dict):
    rows = result.get("rows") or []
    if not rows:
        return None
    fig, (speed, floor) = plt.subplots(1, 2, figsize=(12, 1.5 + 0.2 * len(rows)), sharey=True)
    ys = range(len(rows))
    colours = [MODE_COLOURS.get(r["mode"], "#999999") for r in rows]
    # each bar runs from the 1x line (on a log axis a bar from 0 starts at the axis' edge: 0.75x and 0.78x drew
    # 1:3 in length)
    speed.barh(ys, [r["ratio"] - 1.0 for r in rows], left=1.0, color=colours)
    speed.axvline(1.0, color="black", lw=0.8)
    speed.set_xscale("log")
    speed.set_xlabel("torch time / normlab time (right of the line: normlab faster)")
    floor.barh(ys, [r["floor_pct"] for r in rows], color=colours)
    floor.axvline(100, color="black", lw=0.8)
    floor.set_xlabel(f"% of the memory-copy floor (copy {result.get('copy_gbps', '?')} GB/s)")
    speed.set_yticks(list(ys), _labels(rows, "op", "shape", "dtype", "mode"), fontsize=7)
    speed.invert_yaxis()
    from matplotlib.patches import Patch

    floor.legend(handles=[Patch(color=c, label=m) for m, c in MODE_COLOURS.items()], fontsize=7, loc="best")
    return fig


def _model(plt, result: dict):
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    for ax, (title, key) in zip(axes, (("training step", "train_step"), ("inference", "inference"))):
        r = result[key]
        names = list(r["ms"])
        ax.barh(range(len(names)), [r["ms"][n] for n in names], color="#bbbbbb")
        for i, n in enumerate(names):  # each round's median, where there were rounds
            rounds = (r.get("rounds_ms") or {}).get(n) or []
            ax.plot(rounds, [i] * len(rounds), "k.", ms=4)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{title}, ms (bar: median; dots: rounds)")
    return fig


def _dispatch(plt, result: dict):
    rows = [r for r in result.get("rows") or [] if r.get("ms")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.2 * len(rows)))
    names = sorted({n for r in rows for n in r["ms"]})
    height = 0.8 / len(names)
    for j, name in enumerate(names):
        ys = [i + j * height for i in range(len(rows))]
        ms = [r["ms"].get(name, 0.0) for r in rows]
        ax.barh(ys, ms, height=height, label=name, color=f"C{j}",
                edgecolor=["black" if r["impl"] == name else "none" for r in rows])
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))], _labels(rows, "op", "shape", "dtype", "mode"),
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms on the decision's sample (outlined: what auto runs)")
    ax.legend(fontsize=7)
    return fig
