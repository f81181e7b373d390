"""UEM files: the regions of each recording that are scored (the format is in docs/diarization.md).

``<uri> <channel> <onset> <offset>`` per region, seconds; a field that starts with ``;``
starts a comment (to the line's end), and so does a ``;`` inside any other field than the uri (a uri may hold a
``;``, not begin with one).
"""
from __future__ import annotations

import pathlib
from collections import defaultdict

from ..._checks import BadValue, read_text_file
from .rttm import check_seconds, check_token, parse_seconds, table_fields, table_lines


def check_region(region, what: str = "UEM region") -> None:
    """Raise BadValue unless ``region`` is an ``(onset, offset)`` pair of seconds (``check_seconds``), in order."""
    try:
        on, off = region
    except (TypeError, ValueError):
        raise BadValue(f"{what} must be an (onset, offset) pair of seconds, got {region!r}") from None
    check_seconds(on, f"{what} {region!r}: onset")
    check_seconds(off, f"{what} {region!r}: offset")
    if off < on:
        raise BadValue(f"{what} {region!r} ends before it starts")


def uncovered(uris, regions: dict[str, list[tuple[float, float]]] | None) -> list[str]:
    """The ``uris`` (sorted) a UEM gives no time to score: not named, or named with regions of 0 s only (none
    where there is no UEM: then the whole extent is scored)."""
    if regions is None:
        return []
    return sorted(u for u in uris if not any(off > on for on, off in regions.get(u, ())))


def _uncommented(fields: list[str]) -> list[str]:
    """A UEM line's fields before its comment: from a field that begins with ``;``, or from a ``;`` inside any
    field but the uri (``a 1 0.0 1.0;; note``: numbers never hold one, a uri may)."""
    for i, f in enumerate(fields):
        if f.startswith(";"):
            return fields[:i]
        if i > 0 and ";" in f:
            return [*fields[:i], f.split(";", 1)[0]]
    return fields


def read_uem(path: str | pathlib.Path) -> dict[str, list[tuple[float, float]]]:
    """Scored regions per uri."""
    regions: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for n, line in enumerate(table_lines(read_text_file(path, "UEM")), start=1):
        fields = _uncommented(table_fields(line))
        if not fields:
            continue
        try:
            if len(fields) != 4:
                raise ValueError(f"expected 4 fields (uri channel onset offset), got {len(fields)}")
            on, off = parse_seconds(fields[2], "onset"), parse_seconds(fields[3], "offset")
            check_region((on, off), "region")
        except ValueError as e:
            raise BadValue(f"{path}:{n}: bad UEM line ({e}): {line!r}") from None
        regions[fields[0]].append((on, off))
    return {uri: sorted(r) for uri, r in regions.items()}


def write_uem(regions: dict[str, list[tuple[float, float]]], path: str | pathlib.Path) -> None:
    """Write ``{uri: [(onset, offset), ...]}``; BadValue, before writing, on a region read_uem would refuse."""
    pathlib.Path(path).write_text(format_uem(regions), encoding="utf-8")


def format_uem(regions: dict[str, list[tuple[float, float]]]) -> str:
    """UEM text of ``{uri: [(onset, offset), ...]}``, one region a line, sorted; BadValue on a region read_uem
    would refuse."""
    if not isinstance(regions, dict):
        raise BadValue(f"UEM regions must be a dict {{uri: [(onset, offset), ...]}}, got a {type(regions).__name__}")
    for uri, rs in regions.items():
        check_token(uri, "uri")
        if uri.startswith(";"):
            raise BadValue(f"a UEM uri cannot begin with ';' (it would read back as a comment), got {uri!r}")
        for r in rs:
            check_region(r, f"UEM region of {uri}")
    lines = [f"{uri} 1 {on:.3f} {off:.3f}" for uri in sorted(regions) for on, off in sorted(regions[uri])]
    return "".join(line + "\n" for line in lines)
