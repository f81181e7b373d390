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


def runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of True (or nonzero) frames in a 1-D ``mask``, ``end`` one past its last."""
    m = mask.to(torch.int8)
    edges = torch.diff(m, prepend=m.new_zeros(1), append=m.new_zeros(1))
    return list(zip(torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()))


def fill_gaps(active: torch.Tensor, frames: int) -> torch.Tensor:
    """``active (frames, speakers)`` (0/1) with each speaker's pauses shorter than ``frames`` filled: a run of
    inactive frames with that speaker active on both sides becomes active (pyannote.audio's ``min_duration_off``).
    A pause at the start or end of the recording is never filled, nor one of ``frames`` or more."""
    if frames <= 1 or active.shape[0] == 0:
        return active
    out = active.clone()
    for k in range(active.shape[1]):
        spans = runs(active[:, k])
        for (_, a), (b, _) in zip(spans, spans[1:]):  # the pause between two runs
            if b - a < frames:
                out[a:b, k] = 1
    return out


def to_turns(probs: torch.Tensor, frame_seconds: float, uri: str, *, threshold: float = 0.5, median: int = 11,
             labels: list[str] | None = None) -> list[Turn]:
    """Turns from ``probs (frames, speakers)``: active where ``p > threshold``, smoothed, then runs."""
    active = median_filter((probs > threshold).to(torch.uint8), median).bool()  # T, S
    labels = labels or [f"spk{k}" for k in range(probs.shape[1])]
    turns = [Turn(uri, a * frame_seconds, (b - a) * frame_seconds, labels[k])
             for k in range(active.shape[1]) for a, b in runs(active[:, k])]
    return sorted(turns)
