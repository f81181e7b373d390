"""UEM files: the regions of each recording that are scored (the format is in docs/diarization.md).

``<uri> <channel> <onset> <offset>`` per region, seconds; ``;`` starts a comment.
"""
from __future__ import annotations

import math
import pathlib
from collections import defaultdict

from ..._checks import BadValue, read_text_file


def read_uem(path: str | pathlib.Path) -> dict[str, list[tuple[float, float]]]:
    """Scored regions per uri."""
    regions: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for n, line in enumerate(read_text_file(path, "UEM").splitlines(), start=1):
        line = line.split(";", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        try:
            on, off = float(fields[2]), float(fields[3])
            if not (math.isfinite(on) and math.isfinite(off)) or on < 0:
                raise ValueError("onset and offset must be finite and not negative")
            if off < on:
                raise ValueError(f"offset {off} before onset {on}")
        except (IndexError, ValueError) as e:
            raise BadValue(f"{path}:{n}: bad UEM line ({e}): {line!r}") from None
        regions[fields[0]].append((on, off))
    return {uri: sorted(r) for uri, r in regions.items()}


def write_uem(regions: dict[str, list[tuple[float, float]]], path: str | pathlib.Path) -> None:
    lines = [f"{uri} 1 {on:.3f} {off:.3f}" for uri in sorted(regions) for on, off in sorted(regions[uri])]
    pathlib.Path(path).write_text("".join(line + "\n" for line in lines))
