"""Diarization Error Rate, computed exactly on time intervals.

DER = (false alarm + missed speech + speaker confusion) / total reference
speech. Overlap counts once per speaker present. Reference and hypothesis
speakers are mapped one-to-one by the Hungarian algorithm on their
co-occurrence time within the scored region. ``collar`` removes ``collar``
seconds on each side of every reference turn boundary (md-eval's ``-c``;
pyannote.metrics' ``collar`` is the total width, twice this). ``skip_overlap``
removes regions where two or more reference speakers talk. ``uem`` restricts
scoring to its regions; without it, the extent of reference and hypothesis.
"""
from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ..._checks import BadValue, check_flag
from ..io.rttm import Turn, check_seconds, check_turns
from ..io.uem import check_region

Intervals = list[tuple[float, float]]


def merge(intervals) -> Intervals:
    """Sorted union of ``(start, end)`` intervals, zero-length ones dropped."""
    out: Intervals = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def intersect(a: Intervals, b: Intervals) -> Intervals:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b`` (both merged)."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def _by_speaker(turns: list[Turn]) -> dict[str, Intervals]:
    spk: dict[str, list] = defaultdict(list)
    for t in turns:
        spk[t.speaker].append((t.start, t.end))
    return {k: merge(v) for k, v in spk.items()}


def _active(intervals: Intervals, t: float) -> bool:
    i = bisect.bisect_right(intervals, (t, math.inf)) - 1
    return i >= 0 and intervals[i][0] <= t < intervals[i][1]


@dataclass
class DERResult:
    false_alarm: float = 0.0
    missed: float = 0.0
    confusion: float = 0.0
    total: float = 0.0  # reference speech, seconds, counted per speaker

    @property
    def der(self) -> float:
        err = self.false_alarm + self.missed + self.confusion
        if self.total == 0:
            return 0.0 if err == 0 else math.inf
        return err / self.total

    def __add__(self, other: "DERResult") -> "DERResult":
        if not isinstance(other, DERResult):
            return NotImplemented
        return DERResult(self.false_alarm + other.false_alarm, self.missed + other.missed,
                         self.confusion + other.confusion, self.total + other.total)

    def __radd__(self, other) -> "DERResult":
        """``sum(results)``: its start, 0, adds nothing."""
        if other == 0:
            return self
        return NotImplemented

    def format(self) -> str:
        t = self.total or 1.0
        return "\n".join([
            f"DER: {100 * self.der:.2f}%",
            f"  false alarm: {self.false_alarm:.3f} s ({100 * self.false_alarm / t:.2f}%)",
            f"  missed:      {self.missed:.3f} s ({100 * self.missed / t:.2f}%)",
            f"  confusion:   {self.confusion:.3f} s ({100 * self.confusion / t:.2f}%)",
            f"  total reference speech: {self.total:.3f} s",
        ])


def _check_turns(turns, what: str) -> None:
    check_turns(turns, what, "score one at a time, or all with score({uri: turns})", table="score()")


def _check_uem(uem) -> None:
    """``uem`` must be None or a list of ``(start, end)`` regions (``check_region``)."""
    if uem is None:
        return
    if not isinstance(uem, (list, tuple)):
        raise BadValue(f"uem of one recording must be a list of (start, end) regions, got a {type(uem).__name__}"
                       + (" (score() takes {uri: regions})" if isinstance(uem, Mapping) else ""))
    for r in uem:
        check_region(r, "uem region")


def scored_region(reference: list[Turn], hypothesis: list[Turn], *, collar: float = 0.0,
                  skip_overlap: bool = False, uem: Intervals | None = None) -> Intervals:
    """The time that counts: UEM (or the extent of both), minus collars and (optionally) overlap.

    Raises BadValue unless ``reference`` and ``hypothesis`` are lists of one recording's turns (the uri may
    differ between them: ``diarize(waveform)`` names its turns "audio"), times in seconds from 0 to 1e7,
    ``collar`` such a number and ``uem`` None or a list of ``(start, end)`` regions in order.
    """
    check_seconds(collar, "collar")
    check_flag(skip_overlap, "skip_overlap")  # ("no" was true: overlap left out, silently)
    _check_turns(reference, "reference")
    _check_turns(hypothesis, "hypothesis")
    _check_uem(uem)
    # a turn of zero length is no speech: it has no boundaries to forgive and does not stretch the extent
    # (pyannote.core drops such segments from an Annotation)
    reference = [t for t in reference if t.duration > 0]
    if uem is not None:
        region = merge(uem)
    else:
        all_turns = [*reference, *(t for t in hypothesis if t.duration > 0)]
        region = merge([(min(t.start for t in all_turns), max(t.end for t in all_turns))]) if all_turns else []
    if collar > 0:
        edges = [(b - collar, b + collar) for t in reference for b in (t.start, t.end)]
        region = subtract(region, merge(edges))
    if skip_overlap:
        spk = list(_by_speaker(reference).values())
        overlap = merge(iv for i in range(len(spk)) for j in range(i + 1, len(spk)) for iv in intersect(spk[i], spk[j]))
        region = subtract(region, overlap)
    return region


def _mapping(ref: dict[str, Intervals], hyp: dict[str, Intervals]) -> list[tuple[str, str]]:
    """The one-to-one ``(reference, hypothesis)`` speaker pairs with the most co-occurrence time (Hungarian).

    A pair that never talks at the same time is no match (as pyannote.metrics' mapper): its hypothesis speaker
    maps to no reference speaker. DER is the same either way (such a pair has no correct time)."""
    from scipy.optimize import linear_sum_assignment

    rn, hn = sorted(ref), sorted(hyp)
    if not rn or not hn:
        return []
    co = [[sum(e - s for s, e in intersect(ref[r], hyp[h])) for h in hn] for r in rn]
    rows, cols = linear_sum_assignment(co, maximize=True)
    return [(rn[i], hn[j]) for i, j in zip(rows, cols) if co[i][j] > 0]


def speaker_mapping(reference: list[Turn], hypothesis: list[Turn], *, collar: float = 0.0,
                    skip_overlap: bool = False, uem: Intervals | None = None) -> dict[str, str]:
    """``{hypothesis speaker: reference speaker}``: the mapping DER scores with (on the same scored region)."""
    region = scored_region(reference, hypothesis, collar=collar, skip_overlap=skip_overlap, uem=uem)
    ref = {k: intersect(v, region) for k, v in _by_speaker(reference).items()}
    hyp = {k: intersect(v, region) for k, v in _by_speaker(hypothesis).items()}
    return {h: r for r, h in _mapping(ref, hyp)}


def diarization_error_rate(reference: list[Turn], hypothesis: list[Turn], *, collar: float = 0.0,
                           skip_overlap: bool = False, uem: Intervals | None = None) -> DERResult:
    """DER components of one recording (turns of a single uri; BadValue on arguments ``scored_region`` refuses)."""
    region = scored_region(reference, hypothesis, collar=collar, skip_overlap=skip_overlap, uem=uem)
    ref = {k: intersect(v, region) for k, v in _by_speaker(reference).items()}
    hyp = {k: intersect(v, region) for k, v in _by_speaker(hypothesis).items()}
    rn, hn = sorted(ref), sorted(hyp)
    pairs = _mapping(ref, hyp)
    cuts = sorted({b for ivs in (*ref.values(), *hyp.values(), region) for iv in ivs for b in iv})
    res = DERResult()
    for a, b in zip(cuts, cuts[1:]):
        mid, dur = (a + b) / 2, b - a
        if not _active(region, mid):
            continue
        r_on = {k for k in rn if _active(ref[k], mid)}
        h_on = {k for k in hn if _active(hyp[k], mid)}
        correct = sum(1 for r, h in pairs if r in r_on and h in h_on)
        res.total += len(r_on) * dur
        res.missed += max(0, len(r_on) - len(h_on)) * dur
        res.false_alarm += max(0, len(h_on) - len(r_on)) * dur
        res.confusion += (min(len(r_on), len(h_on)) - correct) * dur
    return res


def score(reference: dict[str, list[Turn]], hypothesis: dict[str, list[Turn]], *, collar: float = 0.0,
          skip_overlap: bool = False, uem: dict[str, Intervals] | None = None) -> DERResult:
    """Sum of the per-recording components over every reference uri (a missing hypothesis is all miss).

    ``reference``, ``hypothesis`` and ``uem`` (or None) are ``{uri: ...}``, each value as
    ``diarization_error_rate`` takes it; BadValue otherwise. With a ``uem``, only its regions count: a reference
    uri it does not name adds nothing (md-eval's reading of a UEM).
    """
    check_seconds(collar, "collar")  # even with nothing to score
    for what, d in (("reference", reference), ("hypothesis", hypothesis), ("uem", uem)):
        if not isinstance(d, Mapping) and not (what == "uem" and d is None):
            raise BadValue(f"score() takes {what} as {{uri: {'regions' if what == 'uem' else 'turns'}}}, got a "
                           f"{type(d).__name__} (diarization_error_rate scores one recording's list)")
    total = DERResult()
    for uri in sorted(reference):
        total = total + diarization_error_rate(reference[uri], hypothesis.get(uri, []), collar=collar,
                                               skip_overlap=skip_overlap,
                                               uem=None if uem is None else uem.get(uri, []))
    return total
