"""RTTM files: speaker turns (the format is in docs/diarization.md).

``SPEAKER <uri> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>``, times
in seconds with 3 decimals; other line types are skipped on reading.
"""
from __future__ import annotations

import math
import pathlib
import re
from collections import defaultdict
from dataclasses import dataclass

from ..._checks import BadType, BadValue, read_text_file


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


def speaker_count(turns) -> int:
    """How many speakers talk in ``turns``: a speaker whose turns all last 0 s is none (as DER, and pyannote's
    ``Annotation.labels()``, count them)."""
    return len({t.speaker for t in turns if t.duration > 0})


_SEPARATORS = " \t\f\v\r\n"  # what ends a field or a line on reading


def check_token(value: str, what: str) -> None:
    """Raise BadValue unless ``value`` is a non-empty string that reads back as one field of an RTTM or UEM line:
    no space, tab or line end (a no-break space is a character of the field, as reading takes it)."""
    if not isinstance(value, str) or not value or any(c in _SEPARATORS for c in value):
        raise BadValue(f"{what} must be non-empty and without spaces, got {value!r}")


#: the latest time read or written, seconds (about 116 days): a later onset, duration or offset is a corrupt file
MAX_SECONDS = 1e7


def check_seconds(value, what: str) -> None:
    """Raise BadValue unless ``value`` is a number of seconds from 0 to ``MAX_SECONDS`` (NaN is not)."""
    try:
        v = math.nan if isinstance(value, (str, bytes, bool)) else float(value)
    except OverflowError:  # an int beyond float range
        v = math.inf
    except (TypeError, ValueError):
        v = math.nan
    if not 0 <= v <= MAX_SECONDS:
        raise BadValue(f"{what} must be a number of seconds from 0 to {MAX_SECONDS:.0e} (about 116 days), "
                       f"got {value!r}")


def check_turn(turn) -> None:
    """Raise BadValue unless ``turn`` is a ``Turn`` of string uri and speaker whose start and duration pass
    ``check_seconds``."""
    if not isinstance(turn, Turn):
        raise BadValue(f"expected a Turn, got {type(turn).__name__} {turn!r:.80}")
    if not (isinstance(turn.speaker, str) and isinstance(turn.uri, str)):  # (None beside "A" failed in sorted())
        raise BadValue(f"{turn!r:.80}: its uri and speaker must be strings")
    s, d = turn.start, turn.duration
    if not (type(s) in (float, int) and type(d) in (float, int) and 0 <= s <= MAX_SECONDS and 0 <= d <= MAX_SECONDS):
        check_seconds(s, f"{turn}: start")  # the message made only here: DER checks every turn of every call
        check_seconds(d, f"{turn}: duration")


def check_turns(turns, what: str, hint: str = "give one recording's at a time", table: str = "") -> list:
    """``turns`` must be one recording's: a list of ``Turn`` (``check_turn``) of a single uri; returns it.
    ``hint``: what to do with several recordings' turns; ``table``: what takes a ``{uri: turns}`` table."""
    if not isinstance(turns, (list, tuple)):
        raise BadValue(f"{what} must be a list of one recording's turns, got a {type(turns).__name__}"
                       + (f" ({table} takes {{uri: turns}})" if table and isinstance(turns, dict) else ""))
    for t in turns:
        check_turn(t)
    uris = sorted({str(t.uri) for t in turns})
    if len(uris) > 1:
        raise BadValue(f"{what} has turns of {len(uris)} recordings ({', '.join(uris[:3])}"
                       f"{', ...' if len(uris) > 3 else ''}): {hint}")
    return turns


_FIELD_SEP = re.compile(r"[ \t\f\v]+")  # spaces and tabs only: other white space (a no-break space) is part of a field
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", re.ASCII)  # a plain decimal: no 1_0, no ١٢


def table_lines(text: str) -> list[str]:
    """The lines of a text table (RTTM, UEM): a byte-order mark dropped, lines ended by LF, CRLF or CR only
    (``str.splitlines`` also breaks at U+2028, U+0085 and the like, which may sit inside a field)."""
    return re.split(r"\r\n|\r|\n", text.removeprefix("\ufeff"))


def table_fields(line: str) -> list[str]:
    """A table line's fields, separated by spaces and tabs."""
    return [f for f in _FIELD_SEP.split(line) if f]


def parse_seconds(field: str, what: str) -> float:
    """A field's number of seconds; ValueError unless it is a plain decimal number that ``check_seconds`` takes."""
    if not _NUMBER.fullmatch(field):
        raise ValueError(f"{what} is not a decimal number of seconds: {field!r}")
    value = float(field)
    check_seconds(value, what)
    return value


#: the RTTM line types other than SPEAKER (NIST's RTTM format): read past, as comments are
OTHER_TYPES = frozenset({"SEGMENT", "NOSCORE", "NO_RT_METADATA", "LEXEME", "NON-LEX", "NON-SPEECH", "FILLER", "IP",
                         "EDIT", "SU", "CB", "A/P", "SPKR-INFO"})


def read_rttm(path: str | pathlib.Path) -> dict[str, list[Turn]]:
    """Turns per uri, sorted by start. Raises ValueError naming the file and line on a malformed SPEAKER line."""
    turns: dict[str, list[Turn]] = defaultdict(list)
    for n, line in enumerate(table_lines(read_text_file(path, "RTTM")), start=1):
        fields = table_fields(line)
        if not fields or fields[0].startswith((";", "#")) or fields[0] in OTHER_TYPES:
            continue  # a blank line, a comment, or a line of a kind that carries no speaker turn
        if fields[0] != "SPEAKER":
            raise BadValue(f"{path}:{n}: not an RTTM line (its first field is not an RTTM type): {line[:80]!r}")
        try:
            if not 8 <= len(fields) <= 10:  # the last two (<NA> <NA>) carry nothing: a line without them is read
                raise ValueError(f"expected 10 fields (at least the first 8), got {len(fields)}")
            start, dur = parse_seconds(fields[3], "onset"), parse_seconds(fields[4], "duration")
        except ValueError as e:
            raise BadValue(f"{path}:{n}: bad RTTM line ({e}): {line!r}") from None
        turns[fields[1]].append(Turn(fields[1], start, dur, fields[7]))
    return {uri: sorted(ts) for uri, ts in turns.items()}


def format_rttm(turns: list[Turn]) -> str:
    """RTTM text of the turns, sorted, one line each (newline-terminated); BadValue on a turn read_rttm would
    refuse."""
    turns = list(turns)
    for t in turns:  # all checked before sorting (which compares the times)
        check_turn(t)
        check_token(t.uri, "uri")
        check_token(t.speaker, "speaker")
    lines = []
    for t in sorted(turns):
        lines.append(f"SPEAKER {t.uri} 1 {t.start:.3f} {t.duration:.3f} <NA> <NA> {t.speaker} <NA> <NA>\n")
    return "".join(lines)


def write_rttm(turns: list[Turn], path: str | pathlib.Path) -> None:
    if isinstance(turns, Turn):  # (its fields were read as the turns)
        raise BadType("write_rttm takes a list of turns, not one Turn: write_rttm([turn], path)")
    path = pathlib.Path(path)
    if path.is_dir():  # (IsADirectoryError; read_rttm says it this way)
        raise BadValue(f"{path} is a folder where the RTTM file goes")
    path.write_text(format_rttm(turns), encoding="utf-8")
