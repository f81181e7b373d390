"""What ``diarize`` returns: the turns of a recording, with the settings and the models that made them.

``Diarization`` is a list of ``Turn`` (sorted), so code written for ``diarize()``'s list keeps working,
plus ``.turns``, ``.exclusive()`` (one speaker at a time, for aligning with a transcript, as pyannote 4's
``exclusive_speaker_diarization``), ``.to_rttm()``, ``.to_json()`` / ``.to_dict()``.

Exclusive turns (``exclusive_turns``): where several speakers overlap, the one already talking keeps the
floor (the speaker of the previous moment, else the one whose turn began first, else the first by name);
elsewhere nothing changes, and no time is added or removed: the exclusive turns cover exactly the speech.
"""
from __future__ import annotations

import bisect
import json

from ..._checks import BadValue, check_flag
from ..io.rttm import Turn, check_seconds, check_token, check_turn, check_turns, format_rttm

#: boundaries closer than this are one (seconds): turns made as start + duration end an ulp apart
SAME_INSTANT = 1e-9


def exclusive_turns(turns: list[Turn]) -> list[Turn]:
    """The turns with overlap resolved to one speaker at a time (sorted; adjacent pieces of a speaker joined).

    Boundaries within ``SAME_INSTANT`` of each other are one: two speakers who stop on the same frame have ends
    that differ in the last bit (``start + duration``), and the gap between them was a turn of 4e-16 s."""
    turns = check_turns(list(turns), "turns")  # (a generator was read once: [], and bad turns dropped silently)
    if not turns:
        return []
    raw = sorted({b for t in turns for b in (t.start, t.end)})
    cuts = [raw[0]]
    for v in raw[1:]:
        if v - cuts[-1] > SAME_INSTANT:
            cuts.append(v)
    snap = lambda v: cuts[bisect.bisect_right(cuts, v + SAME_INSTANT) - 1]  # noqa: E731   its boundary
    pending = sorted(((snap(t.start), snap(t.end), t) for t in turns), key=lambda p: (p[0], p[2].speaker))
    out: list[Turn] = []
    active: list[tuple] = []
    prev, i = None, 0
    for a, b in zip(cuts, cuts[1:]):  # between two boundaries the set of active turns is constant
        while i < len(pending) and pending[i][0] <= a:
            active.append(pending[i])
            i += 1
        active = [p for p in active if p[1] > a]
        if not active:
            prev = None
            continue
        if prev not in {p[2].speaker for p in active}:
            prev = active[0][2].speaker  # the turn that began first (then by name): the one already talking
        if out and out[-1].speaker == prev and abs(out[-1].end - a) < SAME_INSTANT:
            last = out.pop()
            out.append(Turn(last.uri, last.start, b - last.start, prev))
        else:
            out.append(Turn(active[0][2].uri, a, b - a, prev))
    return sorted(out)


def _plain(v):
    """``v`` with numpy scalars (``np.int64(3)``, ``np.float32(0.4)``, ``np.bool_``) as Python's, in dicts and
    lists too: what ``json`` can write."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    if type(v).__module__ == "numpy" and hasattr(v, "tolist"):  # a numpy scalar or array: Python's numbers
        return v.tolist()
    return v


def _checked(turn) -> Turn:
    """``turn`` checked (``check_turn``: a ``Turn`` of finite seconds) with its times as Python floats (numpy's
    would not write as JSON)."""
    check_turn(turn)
    return Turn(turn.uri, float(turn.start), float(turn.duration), turn.speaker)


class Diarization(list):
    """The turns of one recording (a ``list`` of ``Turn``, sorted) and how they were made.

    Attributes: ``uri``; ``duration`` (seconds of audio, or None); ``settings`` (the pipeline's settings and
    speaker counts); ``provenance`` (normlab's version and the model, speaker-encoder and VAD files with
    their SHA-256); ``is_exclusive`` (one speaker at a time).
    """

    def __init__(self, turns=(), *, uri: str | None = None, duration: float | None = None,
                 settings: dict | None = None, provenance: dict | None = None, is_exclusive: bool = False):
        super().__init__(sorted(_checked(t) for t in turns))  # BadValue on a turn of bad times
        self.uri = uri if uri is not None else (self[0].uri if self else "audio")
        # what the docstring says it is, checked (a uri other than its turns', two recordings' turns, a NaN
        # duration that its JSON then could not hold were all taken)
        check_token(self.uri, "uri")
        others = sorted({t.uri for t in self} - {self.uri})
        if others:
            raise BadValue(f"a Diarization holds the turns of one recording ({self.uri!r}); got turns of "
                           f"{', '.join(map(repr, others[:3]))} too")
        if duration is not None:
            check_seconds(duration, "duration")
        check_flag(is_exclusive, "is_exclusive")
        # numpy numbers a caller passed: JSON's numbers (np.float32 passed here, and to_json failed later)
        self.duration = None if duration is None else float(duration)
        self.settings = _plain(dict(settings or {}))
        self.provenance = _plain(dict(provenance or {}))
        self.is_exclusive = is_exclusive

    @property
    def turns(self) -> list[Turn]:
        return list(self)

    @property
    def speakers(self) -> list[str]:
        """The speaker labels, in order of first speech."""
        return list(dict.fromkeys(t.speaker for t in self))

    @property
    def speech_seconds(self) -> float:
        """Seconds in which anyone speaks (overlapped speech counted once)."""
        from ..metrics.der import merge

        return float(sum(end - start for start, end in merge((t.start, t.end) for t in self)))

    def exclusive(self) -> "Diarization":
        """The same recording with one speaker at a time (``exclusive_turns``)."""
        return Diarization(exclusive_turns(self), uri=self.uri, duration=self.duration, settings=self.settings,
                           provenance=self.provenance, is_exclusive=True)

    def to_rttm(self) -> str:
        return format_rttm(self)

    def to_dict(self) -> dict:
        return {"uri": self.uri, "duration": self.duration, "exclusive": self.is_exclusive,
                "turns": [{"uri": t.uri, "start": round(t.start, 3), "end": round(t.end, 3), "speaker": t.speaker}
                          for t in self],
                "settings": self.settings, "provenance": self.provenance}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)  # NaN is not JSON

    def __repr__(self) -> str:
        return f"Diarization(uri={self.uri!r}, {len(self)} turns{', exclusive' if self.is_exclusive else ''})"


#: ``--format`` values and the file suffix each writes
FORMATS = {"rttm": ".rttm", "json": ".json"}


def render(result: Diarization, fmt: str) -> str:
    """The text of ``result`` in ``fmt`` (``rttm`` or ``json``)."""
    if fmt == "rttm":
        return result.to_rttm()
    if fmt == "json":
        return result.to_json() + "\n"
    raise BadValue(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
