"""Frame probabilities to speaker turns: threshold, median filter, runs (EEND's inference)."""
from __future__ import annotations

import torch

from ..._checks import BadValue
from ..io.rttm import Turn


def median_filter(active: torch.Tensor, width: int) -> torch.Tensor:
    """Median over ``width`` frames (odd) along time of a ``(frames, speakers)`` 0/1 tensor; edges repeated."""
    if width < 1 or width % 2 == 0:
        raise BadValue(f"median filter width must be odd and >= 1, got {width}")
    if width == 1 or active.shape[0] == 0:
        return active
    h = width // 2
    padded = torch.cat([active[:1].expand(h, -1), active, active[-1:].expand(h, -1)])  # T+2h, S
    return padded.unfold(0, width, 1).median(dim=-1).values  # T, S


def to_turns(probs: torch.Tensor, frame_seconds: float, uri: str, *, threshold: float = 0.5, median: int = 11,
             labels: list[str] | None = None) -> list[Turn]:
    """Turns from ``probs (frames, speakers)``: active where ``p > threshold``, smoothed, then runs."""
    active = median_filter((probs > threshold).to(torch.uint8), median).bool()  # T, S
    labels = labels or [f"spk{k}" for k in range(probs.shape[1])]
    turns = []
    for k in range(active.shape[1]):
        col = active[:, k].tolist()
        start = None
        for t, on in enumerate(col + [False]):
            if on and start is None:
                start = t
            elif not on and start is not None:
                turns.append(Turn(uri, start * frame_seconds, (t - start) * frame_seconds, labels[k]))
                start = None
    return sorted(turns)
