"""A model on a simulated folder: frame probabilities once, then DER for any post-processing.

``tune`` chooses the threshold and median-filter width on a development
folder (never on the test folder); ``evaluate`` scores one setting.
"""
from __future__ import annotations

import pathlib
from collections.abc import Iterable

import torch

from .dataset import MixtureSet
from .der import DERResult, score
from .infer import frame_probs
from .model import EENDModel
from .postprocess import to_turns
from .rttm import Turn, read_rttm

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
MEDIANS = (1, 5, 11, 21)


def folder_probs(model: EENDModel, folder: str | pathlib.Path) -> dict[str, torch.Tensor]:
    """``{uri: (frames, speakers) probabilities}`` for every mixture of a simulated folder."""
    data = MixtureSet(folder, n_speakers=model.cfg.n_speakers)
    return {uri: frame_probs(model, feats) for uri, (feats, _) in zip(data.uris, data.items)}


def _hypothesis(probs: dict[str, torch.Tensor], threshold: float, median: int,
                frame_seconds: float) -> dict[str, list[Turn]]:
    return {uri: to_turns(p, frame_seconds, uri, threshold=threshold, median=median) for uri, p in probs.items()}


def evaluate(probs: dict[str, torch.Tensor], reference: dict[str, list[Turn]], *, threshold: float, median: int,
             collar: float = 0.25, frame_seconds: float = 0.1) -> DERResult:
    """DER of the thresholded, median-filtered probabilities against ``reference``."""
    missing = sorted(set(probs) - set(reference))
    if missing:
        raise ValueError(f"no reference turns for {len(missing)} recordings, e.g. {missing[0]!r}")
    hyp = _hypothesis(probs, threshold, median, frame_seconds)
    return score({u: reference[u] for u in probs}, hyp, collar=collar)


def tune(probs: dict[str, torch.Tensor], reference: dict[str, list[Turn]], *, collar: float = 0.25,
         thresholds: Iterable[float] = THRESHOLDS, medians: Iterable[int] = MEDIANS,
         frame_seconds: float = 0.1) -> tuple[dict, list[dict]]:
    """The (threshold, median) with the lowest DER, and every grid point's DER (ties: the earlier point)."""
    grid = []
    for th in thresholds:
        for med in medians:
            r = evaluate(probs, reference, threshold=th, median=med, collar=collar, frame_seconds=frame_seconds)
            grid.append({"threshold": th, "median": med, "der": r.der})
    best = min(grid, key=lambda g: g["der"])
    return {"threshold": best["threshold"], "median": best["median"]}, grid


def reference_of(folder: str | pathlib.Path) -> dict[str, list[Turn]]:
    """The ``ref.rttm`` written by ``normlab diarize simulate``."""
    return read_rttm(pathlib.Path(folder) / "ref.rttm")
