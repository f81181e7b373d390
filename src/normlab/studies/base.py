"""What every study shares: the run context, criteria, the claim record, seed-level uncertainty, figures."""
from __future__ import annotations

import math
import pathlib
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import plotting, provenance, written
from .runner import Runner

SCALES = ("test", "quick", "full")


@dataclass
class Context:
    """Passed to each study's ``run``: where cells run, how big, where figures go.

    ``seed_offset`` shifts every seed (a rerun on a disjoint seed set checks that verdicts are stable).
    """

    runner: Runner
    scale: str  # "test" (make test), "quick" (normlab report --quick), "full"
    out: pathlib.Path  # folder for figures
    seed_offset: int = 0
    root: pathlib.Path | None = None  # the report's folder (studies keep their data there); None: out's parent

    def pick(self, test, quick, full):
        return {"test": test, "quick": quick, "full": full}[self.scale]

    @property
    def seeds(self) -> list[int]:
        """At least 3 seeds for every trained claim outside tests."""
        return [self.seed_offset + s for s in range(self.pick(2, 3, 5))]

    @property
    def init_seeds(self) -> list[int]:
        """Claims measured at initialization are cheap: 20 seeds (8 in tests)."""
        return [self.seed_offset + s for s in range(self.pick(8, 20, 20))]

    @property
    def folder(self) -> pathlib.Path:
        """The report's folder, where a study keeps what it makes besides cells and its figure."""
        return self.out.parent if self.root is None else self.root

    def figure(self, name: str) -> pathlib.Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / figure_file(name)


def figure_file(study: str) -> str:
    """The file name of a study's figure (in the report's ``figures`` folder)."""
    return f"{study}.png"


class Criterion:
    """A claim's pass rule: its limits and the text printed with them, from one object.

    ``Criterion("Pre g{top}/g6 <= {pre_max}", top=24, pre_max=0.75)`` prints
    ``Pre g24/g6 <= 0.75`` and the study compares with ``crit["pre_max"]``;
    :meth:`at` gives the same rule at another size (test-size depths).
    """

    def __init__(self, template: str, **limits):
        self.template, self.limits = template, dict(limits)
        self.text = template.format(**{k: _fmt(v) for k, v in limits.items()})

    def __getitem__(self, key: str):
        return self.limits[key]

    def at(self, **changes) -> Criterion:
        return Criterion(self.template, **{**self.limits, **changes})

    def __repr__(self) -> str:
        return f"Criterion({self.text!r})"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}".replace("e-0", "e-")
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


def claim(cid: str, statement: str, source: str, measured: dict, criterion: Criterion | str, passed: bool | None,
          uncertainty: str = "") -> dict:
    """One row of results.json; ``passed=None`` is a claim that could not be checked here (SKIP).

    ``uncertainty``: the seed-level spread behind the verdict (a bootstrap interval or per-seed range).
    """
    verdict = "SKIP" if passed is None else "PASS" if passed else "FAIL"
    text = criterion.text if isinstance(criterion, Criterion) else criterion
    return {"id": cid, "statement": statement, "source": source, "measured": _clean(measured),
            "criterion": text, "verdict": verdict, "uncertainty": uncertainty}


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


def bootstrap(per_seed: Sequence, stat: Callable[[list], float], n: int = 1000, level: float = 0.9,
              seed: int = 0) -> tuple[float, float]:
    """Percentile interval of ``stat`` over seeds resampled with replacement.

    ``per_seed``: one entry per seed (a number, or a tuple of numbers measured on that seed);
    ``stat`` maps a list of such entries to a number (e.g. a ratio of means).
    """
    rng = random.Random(seed)
    k = len(per_seed)
    vals = sorted(stat([per_seed[rng.randrange(k)] for _ in range(k)]) for _ in range(n))
    lo = vals[int((1 - level) / 2 * (n - 1))]
    hi = vals[int((1 + level) / 2 * (n - 1))]
    return lo, hi


def interval(name: str, per_seed: Sequence, stat: Callable[[list], float]) -> str:
    """``"name 0.51 [0.47, 0.55]"``: the statistic on all seeds and its 90% bootstrap interval."""
    lo, hi = bootstrap(per_seed, stat)
    return f"{name} {stat(list(per_seed)):.3g} [{lo:.3g}, {hi:.3g}]"


def spread(name: str, values: Sequence[float]) -> str:
    """``"name 0.0012 to 3.2 (3 seeds)"``: the per-seed range."""
    vals = list(values)
    return f"{name} {min(vals):.3g} to {max(vals):.3g} ({len(vals)} seeds)"


def pyplot():
    """matplotlib's pyplot (:func:`normlab.plotting.pyplot`) with the studies' figure style."""
    plt = plotting.pyplot("the studies' figures")
    plt.rcParams.update({"figure.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def finish(ctx: Context, fig, name: str, title: str, claims: list[dict]) -> dict:
    """Save ``fig`` as the study's figure and return the study's result."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    # whole or not at all, and recorded: the report's next run may replace it (run_studies checks the folder
    # first); saved in place, a kill mid-save left half a figure that the next run refused as the user's
    meta = provenance.png_metadata(Title=f"normlab study {name}: {title}")  # what made it, inside the file
    written.write_with(ctx.figure(name), lambda tmp: fig.savefig(tmp, bbox_inches="tight", format="png",
                                                                 metadata=meta))
    plt.close(fig)
    return {"name": name, "title": title, "claims": claims, "figure": figure_file(name)}
