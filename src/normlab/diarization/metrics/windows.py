"""Local scoring of a segmentation model: DER per window, as the model sees a recording.

The pipeline runs the EEND model on short windows and leaves linking speakers
across windows to embeddings and clustering. ``window_probs`` cuts each
simulated recording into windows of ``frames`` frames (the last one ends at
the recording's end), runs the model on each on its own, and returns
probabilities and reference turns per window (uri ``<uri>_w<k>``, times from
the window start): any DER function then gives the *local* DER, in which the
speaker mapping is free in every window (pyannote's measure for a
segmentation model). The collar also forgives 0.25 s at a window's edges,
where a reference turn is cut.
"""
from __future__ import annotations

import pathlib

import torch

from ..data.dataset import MixtureSet
from ..io.rttm import Turn, read_rttm
from ..models.eend import EENDModel


def spans(n: int, frames: int) -> list[tuple[int, int]]:
    """Window (start, end) frames covering ``n`` frames: back to back, the last one ending at ``n``."""
    if n <= frames:
        return [(0, n)]
    starts = list(range(0, n - frames + 1, frames))
    if starts[-1] + frames < n:
        starts.append(n - frames)
    return [(s, s + frames) for s in starts]


def crop(turns: list[Turn], uri: str, start: float, end: float) -> list[Turn]:
    """``turns`` inside [start, end), shifted to start at 0, under ``uri``."""
    out = []
    for t in turns:
        a, b = max(t.start, start), min(t.end, end)
        if b > a:
            out.append(Turn(uri, round(a - start, 3), round(b - a, 3), t.speaker))
    return out


@torch.no_grad()
def window_probs(model: EENDModel, folder: str | pathlib.Path, frames: int = 100, frame_seconds: float = 0.1,
                 limit: int | None = None) -> tuple[dict[str, torch.Tensor], dict[str, list[Turn]]]:
    """``({window uri: (frames, speakers) probabilities}, {window uri: reference turns})`` of a simulated folder."""
    folder = pathlib.Path(folder)
    data = MixtureSet(folder, n_speakers=max(model.cfg.n_speakers, 1))
    ref = read_rttm(folder / "ref.rttm")
    model.eval()
    probs, refs = {}, {}
    for uri, (feats, _) in list(zip(data.uris, data.items))[:limit]:
        for k, (s, e) in enumerate(spans(feats.shape[0], frames)):
            w = f"{uri}_w{k}"
            probs[w] = model.activity(feats[None, s:e])[0]
            refs[w] = crop(ref.get(uri, []), w, s * frame_seconds, e * frame_seconds)
    return probs, refs


def speaker_counts(refs: dict[str, list[Turn]]) -> dict[int, int]:
    """How many windows hold 0, 1, 2, ... reference speakers."""
    counts: dict[int, int] = {}
    for turns in refs.values():
        k = len({t.speaker for t in turns})
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items()))
