"""Where the errors are: DER's three kinds per frame, for drawing a recording's timeline.

Frames of ``step`` seconds (10 ms) across the scored region; a speaker is active in a frame when the
frame's centre lies in one of its turns. With the reference and hypothesis speakers mapped as DER maps
them (``der.speaker_mapping``), per frame with ``r`` reference and ``h`` hypothesis speakers active and
``c`` mapped pairs active in both: missed ``max(0, r - h)``, false alarm ``max(0, h - r)``, confusion
``min(r, h) - c``, the counts DER integrates (so the totals times ``step`` approach DER's seconds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..._checks import BadValue
from ..io.rttm import Turn
from .der import Intervals, scored_region, speaker_mapping

KINDS = ("missed", "false_alarm", "confusion")


@dataclass
class FrameErrors:
    step: float  # seconds per frame
    start: float  # time of frame 0's start
    missed: np.ndarray  # (frames,) speakers missed per frame
    false_alarm: np.ndarray
    confusion: np.ndarray
    mapping: dict[str, str]  # hypothesis speaker -> reference speaker

    def spans(self, kind: str) -> list[tuple[float, float]]:
        """``(start, end)`` seconds of the runs of frames with errors of ``kind``."""
        on = np.concatenate([[False], getattr(self, kind) > 0, [False]])
        edges = np.flatnonzero(on[1:] != on[:-1])
        return [(self.start + a * self.step, self.start + b * self.step) for a, b in zip(edges[::2], edges[1::2])]

    def seconds(self, kind: str) -> float:
        return float(getattr(self, kind).sum() * self.step)


def _activity(turns: list[Turn], centres: np.ndarray) -> dict[str, np.ndarray]:
    on: dict[str, np.ndarray] = {}
    for t in turns:
        a = on.setdefault(t.speaker, np.zeros(centres.size, dtype=bool))
        a |= (centres >= t.start) & (centres < t.end)
    return on


def frame_errors(reference: list[Turn], hypothesis: list[Turn], *, step: float = 0.01,
                 uem: Intervals | None = None) -> FrameErrors:
    """Missed, false alarm and confusion per ``step``-second frame of one recording (collar 0)."""
    if not 0 < step < math.inf:  # NaN too
        raise BadValue(f"step must be a finite number of seconds > 0, got {step}")
    region = scored_region(reference, hypothesis, uem=uem)
    mapping = speaker_mapping(reference, hypothesis, uem=uem)
    # only frames where someone speaks can hold an error: the grid is laid over the turns' span alone (a UEM a
    # million seconds long made 10^8 frames for a 30 s recording), on the same frame boundaries
    turns = [t for t in (*reference, *hypothesis) if t.end > t.start]
    if not region or not turns:
        empty = np.zeros(0, dtype=np.int64)
        return FrameErrors(step, region[0][0] if region else 0.0, empty, empty.copy(), empty.copy(), mapping)
    start, end = region[0][0], region[-1][1]
    n = int(np.ceil((end - start) / step - 1e-9))  # frames of the grid over the whole scored region
    first = min(max(0, math.floor((min(t.start for t in turns) - start) / step)), n)
    last = max(min(n, math.ceil((max(t.end for t in turns) - start) / step)), first)
    centres = start + (np.arange(first, last) + 0.5) * step
    start = start + first * step
    scored = np.zeros(centres.size, dtype=bool)
    for a, b in region:
        scored |= (centres >= a) & (centres < b)
    ref, hyp = _activity(reference, centres), _activity(hypothesis, centres)
    zero = np.zeros(centres.size, dtype=np.int64)
    r = sum((a.astype(np.int64) for a in ref.values()), zero) * scored
    h = sum((a.astype(np.int64) for a in hyp.values()), zero) * scored
    correct = sum((ref[rs] & hyp[hs]).astype(np.int64) for hs, rs in mapping.items()) * scored if mapping else zero
    return FrameErrors(step, start, np.maximum(0, r - h), np.maximum(0, h - r), np.minimum(r, h) - correct, mapping)
