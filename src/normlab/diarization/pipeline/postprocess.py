"""Frame probabilities to speaker turns: threshold, median filter, runs (EEND's inference)."""
from __future__ import annotations

import math

import torch

from ..._checks import BadType, BadValue
from ..io.rttm import Turn, check_token


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
    m = (mask != 0).to(torch.int8)  # (a cast alone dropped fractions and wrapped 255 to -1)
    edges = torch.diff(m, prepend=m.new_zeros(1), append=m.new_zeros(1))
    return list(zip(torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()))


def fill_gaps(active: torch.Tensor, frames: int, *, exclusive: bool = False) -> torch.Tensor:
    """``active (frames, speakers)`` (0/1) with each speaker's pauses shorter than ``frames`` filled: a run of
    inactive frames with that speaker active on both sides becomes active (pyannote.audio's ``min_duration_off``).
    A pause at the start or end of the recording is never filled, nor one of ``frames`` or more. ``exclusive``
    (one speaker at a time, ``speech`` mode): only the pause's frames no other speaker holds are filled, so a
    fill never adds overlap (a short turn of B between two of A's stays B's alone); where two speakers' pauses
    share a silent frame, the first speaker takes it."""
    if frames <= 1 or active.shape[0] == 0:
        return active
    out = active.clone()
    for k in range(active.shape[1]):
        spans = runs(active[:, k])
        for (_, a), (b, _) in zip(spans, spans[1:]):  # the pause between two runs
            if b - a < frames:
                if exclusive:  # the frames of the pause where nobody else speaks (after the fills before)
                    out[a:b, k] = (out[a:b].sum(1) - out[a:b, k] == 0).to(out.dtype)
                else:
                    out[a:b, k] = 1
    return out


def hold(active: torch.Tensor, probs: torch.Tensor, low: float) -> torch.Tensor:
    """``active (frames, speakers)`` (0/1) with each speaker's turns held on through frames where nobody is active
    while that speaker's probability ``probs`` stays above ``low``: hysteresis (pyannote.audio's ``offset``
    below its ``onset``). A turn starts where the speaker is active; its run of frames above ``low`` around it
    is that speaker's, but only the frames no speaker holds are given to it, so a hold never adds overlap; where
    two speakers' runs reach the same silent frame, the likelier takes it. Runs above ``low`` that touch none of
    the speaker's active frames add nothing."""
    if active.shape[0] == 0 or active.shape[1] == 0:
        return active
    above = probs > low  # T, S
    begins = above & ~torch.cat([above.new_zeros(1, above.shape[1]), above[:-1]])
    run = begins.long().cumsum(0) * above  # T, S: each speaker's runs above low numbered from 1; 0 outside them
    has_turn = torch.zeros(int(run.max()) + 1, above.shape[1]).scatter_add_(0, run, (active.bool() & above).float())
    claim = above & (has_turn.gather(0, run) > 0) & (active.sum(1, keepdim=True) == 0)  # T, S
    likeliest = torch.where(claim, probs, torch.full_like(probs, -1.0)).argmax(1)  # T
    frames = claim.any(1).nonzero().squeeze(1)
    out = active.clone()
    out[frames, likeliest[frames]] = 1
    return out


def to_turns(probs: torch.Tensor, frame_seconds: float, uri: str, *, threshold: float = 0.5, median: int = 11,
             labels: list[str] | None = None) -> list[Turn]:
    """Turns from ``probs (frames, speakers)``: active where ``p > threshold``, smoothed, then runs."""
    # (a NaN or > 1 threshold gave no turns, two equal labels merged two speakers, a 1-D probs or a float median
    # failed inside torch)
    if not (isinstance(probs, torch.Tensor) and probs.dim() == 2 and probs.dtype.is_floating_point):
        got = list(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise BadType(f"probs must be a floating-point tensor (frames, speakers), got {got}")
    if not 0 < frame_seconds < math.inf:  # (0 made zero-length turns, a negative one negative durations)
        raise BadValue(f"frame_seconds must be a finite number of seconds > 0, got {frame_seconds}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise BadValue(f"threshold must be a probability from 0 to 1, got {threshold!r}")
    if isinstance(median, bool) or not isinstance(median, int):
        raise BadType(f"median must be an odd whole number of frames, got {median!r}")
    check_token(uri, "uri")
    if labels is not None:
        if len(labels) < probs.shape[1]:
            raise BadValue(f"{len(labels)} labels for {probs.shape[1]} speakers")
        if len(set(labels)) < len(labels):
            raise BadValue(f"labels must name each of the {probs.shape[1]} speakers once, got {list(labels)[:8]}")
        for label in labels:
            check_token(label, "a speaker label")
    active = median_filter((probs > threshold).to(torch.uint8), median).bool()  # T, S
    labels = labels or [f"spk{k}" for k in range(probs.shape[1])]
    turns = [Turn(uri, a * frame_seconds, (b - a) * frame_seconds, labels[k])
             for k in range(active.shape[1]) for a, b in runs(active[:, k])]
    return sorted(turns)
