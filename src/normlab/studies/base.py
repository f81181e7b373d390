"""What every study shares: the run context, the claim record, figure helpers."""
from __future__ import annotations

import math
import pathlib
import statistics
from dataclasses import dataclass

from .runner import Runner

SCALES = ("test", "quick", "full")


@dataclass
class Context:
    """Passed to each study's ``run``: where cells run, how big, where figures go."""

    runner: Runner
    scale: str  # "test" (make test), "quick" (normlab report --quick), "full"
    out: pathlib.Path  # folder for figures

    def pick(self, test, quick, full):
        return {"test": test, "quick": quick, "full": full}[self.scale]

    @property
    def seeds(self) -> list[int]:
        """At least 3 seeds for every trained claim outside tests."""
        return list(range(self.pick(2, 3, 5)))

    def figure(self, name: str) -> pathlib.Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / f"{name}.png"


def claim(cid: str, statement: str, source: str, measured: dict, criterion: str, passed: bool | None) -> dict:
    """One row of results.json; ``passed=None`` is a claim that could not be checked here (SKIP)."""
    verdict = "SKIP" if passed is None else "PASS" if passed else "FAIL"
    return {"id": cid, "statement": statement, "source": source, "measured": _clean(measured),
            "criterion": criterion, "verdict": verdict}


def _clean(v):
    if isinstance(v, float):
        return None if math.isnan(v) else ("inf" if math.isinf(v) else float(f"{v:.4g}"))
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def mean(values) -> float:
    values = list(values)
    return math.inf if any(math.isinf(v) for v in values) else statistics.fmean(values)


def pyplot():
    """matplotlib's pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def finish(ctx: Context, fig, name: str, title: str, claims: list[dict]) -> dict:
    """Save ``fig`` as the study's figure and return the study's result."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(ctx.figure(name), bbox_inches="tight")
    plt.close(fig)
    return {"name": name, "title": title, "claims": claims, "figure": f"{name}.png"}
