"""RTTM and UEM files (formats in DIARIZATION.md).

RTTM: ``SPEAKER <uri> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>``,
times in seconds with 3 decimals; other line types are skipped on reading.
UEM: ``<uri> <channel> <onset> <offset>`` per scored region; ``;`` starts a comment.
"""
from __future__ import annotations

import pathlib
from collections import defaultdict
from dataclasses import dataclass

from .._checks import BadValue, existing_file


@dataclass(frozen=True, order=True)
class Turn:
    """One speaker turn: ``speaker`` talks in ``[start, start + duration)`` of recording ``uri``."""

    uri: str
    start: float
    duration: float
    speaker: str

    @property
    def end(self) -> float:
        return self.start + self.duration


def _check_token(value: str, what: str) -> None:
    if not value or any(c.isspace() for c in value):
        raise BadValue(f"{what} must be non-empty and without spaces, got {value!r}")


def read_rttm(path: str | pathlib.Path) -> dict[str, list[Turn]]:
    """Turns per uri, sorted by start. Raises ValueError naming the file and line on a malformed SPEAKER line."""
    turns: dict[str, list[Turn]] = defaultdict(list)
    for n, line in enumerate(existing_file(path).read_text().splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] != "SPEAKER":
            continue
        try:
            if len(fields) < 8:
                raise ValueError(f"expected 10 fields, got {len(fields)}")
            start, dur = float(fields[3]), float(fields[4])
            if dur < 0:
                raise ValueError(f"negative duration {dur}")
        except ValueError as e:
            raise BadValue(f"{path}:{n}: bad RTTM line ({e}): {line!r}") from None
        turns[fields[1]].append(Turn(fields[1], start, dur, fields[7]))
    return {uri: sorted(ts) for uri, ts in turns.items()}


def write_rttm(turns: list[Turn], path: str | pathlib.Path) -> None:
    lines = []
    for t in sorted(turns):
        _check_token(t.uri, "uri")
        _check_token(t.speaker, "speaker")
        lines.append(f"SPEAKER {t.uri} 1 {t.start:.3f} {t.duration:.3f} <NA> <NA> {t.speaker} <NA> <NA>")
    pathlib.Path(path).write_text("".join(line + "\n" for line in lines))


def read_uem(path: str | pathlib.Path) -> dict[str, list[tuple[float, float]]]:
    """Scored regions per uri."""
    regions: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for n, line in enumerate(existing_file(path).read_text().splitlines(), start=1):
        line = line.split(";", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        try:
            on, off = float(fields[2]), float(fields[3])
            if off < on:
                raise ValueError(f"offset {off} before onset {on}")
        except (IndexError, ValueError) as e:
            raise BadValue(f"{path}:{n}: bad UEM line ({e}): {line!r}") from None
        regions[fields[0]].append((on, off))
    return {uri: sorted(r) for uri, r in regions.items()}


def write_uem(regions: dict[str, list[tuple[float, float]]], path: str | pathlib.Path) -> None:
    lines = [f"{uri} 1 {on:.3f} {off:.3f}" for uri in sorted(regions) for on, off in sorted(regions[uri])]
    pathlib.Path(path).write_text("".join(line + "\n" for line in lines))
