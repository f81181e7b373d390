"""Timelines: who spoke when, drawn. ``timeline_png`` (matplotlib, the ``plot`` extra) for ``normlab diarize --plot``.

One row per speaker (in order of first speech), each turn a bar over time, and a last row ``overlap``
that is dark wherever two or more speakers talk at once. The geometry is fixed in pixels
(``Layout``), so a figure can be read back: time ``t`` of row ``i`` is pixel ``(layout.y(i), layout.x(t))``.
The colours are shared with the evaluation page (``metrics/report_html.py``).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

from .. import plotting
from .io.rttm import Turn

#: one colour per speaker, in order of first speech (cycled after ten)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
OVERLAP = "#222222"
#: the evaluation page's error kinds
ERROR_COLOURS = {"missed": "#f0a30a", "false_alarm": "#e51400", "confusion": "#7a3db8"}
DPI = 100


def speakers_in_order(turns: list[Turn]) -> list[str]:
    """Speakers by their first turn's start (then by name)."""
    first: dict[str, float] = {}
    for t in turns:
        first[t.speaker] = min(first.get(t.speaker, t.start), t.start)
    return sorted(first, key=lambda s: (first[s], s))


def overlap_spans(turns: list[Turn]) -> list[tuple[float, float]]:
    """Where two or more speakers talk at once (a speaker's own overlapping turns count once)."""
    from .metrics.der import intersect, merge

    by: dict[str, list] = {}
    for t in turns:
        by.setdefault(t.speaker, []).append((t.start, t.end))
    spans = [merge(v) for v in by.values()]
    return merge(iv for i in range(len(spans)) for j in range(i + 1, len(spans))
                 for iv in intersect(spans[i], spans[j]))


@dataclass(frozen=True)
class Layout:
    """Pixel geometry of a timeline image: rows of ``row_px`` between fixed margins, ``duration`` seconds wide."""

    rows: int
    duration: float
    width: int = 1200
    row_px: int = 36
    left: int = 150
    right: int = 20
    top: int = 36
    bottom: int = 44

    @property
    def height(self) -> int:
        return self.top + self.rows * self.row_px + self.bottom

    def x(self, t: float) -> int:
        """Pixel column of time ``t``."""
        return int(self.left + (self.width - self.left - self.right) * t / self.duration)

    def y(self, row: int) -> int:
        """Pixel row of the centre of row ``row`` (0 at the top)."""
        return int(self.top + (row + 0.5) * self.row_px)


def pyplot():
    """matplotlib's pyplot (:func:`normlab.plotting.pyplot`) for the timelines."""
    return plotting.pyplot("timeline plots")


def timeline_title(turns: list[Turn], uri: str | None = None) -> str:
    """"uri: N speakers, S s of speech, O s overlapped": speech counted once where voices overlap (as the
    command line and ``Diarization.speech_seconds`` count it); ``uri`` names a recording without turns."""
    from .metrics.der import merge

    n = len(speakers_in_order(turns))
    speech = sum(b - a for a, b in merge((t.start, t.end) for t in turns))
    name = uri if uri is not None else (turns[0].uri if turns else "recording")
    return (f"{name}: {n} speaker{'' if n == 1 else 's'}, {speech:.1f} s of speech, "
            f"{sum(b - a for a, b in overlap_spans(turns)):.1f} s overlapped")


def timeline_png(turns: list[Turn], path: str | pathlib.Path, *, duration: float | None = None,
                 title: str | None = None, metadata: dict | None = None, uri: str | None = None) -> Layout:
    """Draw the turns (speakers as rows, an overlap row) to ``path`` (PNG); the layout it used. ``metadata``:
    the PNG's text chunks (default: what made it, :func:`normlab.provenance.png_metadata`); ``uri``: the
    recording's name in the title (default: its turns')."""
    plt = pyplot()
    speakers = speakers_in_order(turns)
    end = max([t.end for t in turns] + [duration or 0.0])
    lay = Layout(rows=len(speakers) + 1, duration=end if end > 0 else 1.0)
    fig = plt.figure(figsize=(lay.width / DPI, lay.height / DPI), dpi=DPI)
    w, h = lay.width, lay.height
    ax = fig.add_axes([lay.left / w, lay.bottom / h, (w - lay.left - lay.right) / w, lay.rows * lay.row_px / h])
    ax.set_xlim(0, lay.duration)
    ax.set_ylim(lay.rows, 0)
    rows = {s: i for i, s in enumerate(speakers)}
    for t in turns:
        ax.broken_barh([(t.start, t.duration)], (rows[t.speaker] + 0.15, 0.7),
                       facecolors=PALETTE[rows[t.speaker] % len(PALETTE)], linewidth=0)
    ov = overlap_spans(turns)
    if ov:
        ax.broken_barh([(a, b - a) for a, b in ov], (len(speakers) + 0.15, 0.7), facecolors=OVERLAP, linewidth=0)
    # names drawn as written (parse_math off): "$x^2$" was drawn as a formula, and "$\\bad$" raised, stopping a batch
    ax.set_yticks([i + 0.5 for i in range(lay.rows)], [*speakers, "overlap"], parse_math=False)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("time (s)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    fig.suptitle(title or timeline_title(turns, uri), x=lay.left / w, ha="left", fontsize=10, parse_math=False)
    from ..provenance import png_metadata

    fig.savefig(path, format="png", dpi=DPI, facecolor="white",  # (a temporary file's name ends in .tmp)
                metadata=png_metadata() if metadata is None else metadata)
    plt.close(fig)
    return lay
