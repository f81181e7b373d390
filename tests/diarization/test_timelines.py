"""What the timelines draw: the PNG of ``diarize --plot`` read back pixel by pixel, the evaluation page's SVG parsed
row by row, and the per-frame errors they show against DER's own seconds."""
import html.parser
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from normlab.diarization import Turn
from normlab.diarization.metrics.der import diarization_error_rate, speaker_mapping
from normlab.diarization.metrics.frame_errors import frame_errors
from normlab.diarization.metrics.report_html import evaluation_page
from normlab.diarization.plot import ERROR_COLOURS, OVERLAP, PALETTE, timeline_png

SVG = "{http://www.w3.org/2000/svg}"
# reference: A 0-4, B 3-8 (overlap 3-4), A 9-10
REF = [Turn("r", 0.0, 4.0, "A"), Turn("r", 3.0, 5.0, "B"), Turn("r", 9.0, 1.0, "A")]
# hypothesis: x 0-5 (mostly A), y 5-8 (B): overlap 3-4 missed, 4-5 confused; A 9-10 missed; z 11-12 false alarm
HYP = [Turn("r", 0.0, 5.0, "x"), Turn("r", 5.0, 3.0, "y"), Turn("r", 11.0, 1.0, "z")]


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])


def test_frame_errors_are_where_der_counts_them():
    err = frame_errors(REF, HYP)
    assert err.mapping == {"x": "A", "y": "B"} == speaker_mapping(REF, HYP)
    rounded = lambda kind: [(round(a, 6), round(b, 6)) for a, b in err.spans(kind)]  # noqa: E731
    assert rounded("missed") == [(3.0, 4.0), (9.0, 10.0)]
    assert rounded("confusion") == [(4.0, 5.0)]
    assert rounded("false_alarm") == [(11.0, 12.0)]
    der = diarization_error_rate(REF, HYP)
    for kind in ("missed", "false_alarm", "confusion"):
        assert err.seconds(kind) == pytest.approx(getattr(der, kind), abs=0.02), kind


def test_speakers_that_never_talk_together_are_not_mapped():
    # y talks only where no reference speaker does: pure false alarm, mapped to no one (as pyannote.metrics)
    ref = [Turn("r", 0.0, 5.0, "A"), Turn("r", 10.0, 5.0, "B")]
    hyp = [Turn("r", 0.0, 5.0, "x"), Turn("r", 20.0, 5.0, "y")]
    assert speaker_mapping(ref, hyp) == {"x": "A"} == frame_errors(ref, hyp).mapping
    assert diarization_error_rate(ref, hyp).der == pytest.approx(1.0)  # B missed, y false alarm: 10 s of 10


def test_frame_errors_on_random_turns_sum_to_der():
    rng = np.random.default_rng(3)

    def turns(names):
        return [Turn("u", float(s), float(d), str(rng.choice(names)))
                for s, d in zip(rng.uniform(0, 60, 25).round(2), rng.uniform(0.3, 6, 25).round(2))]

    ref, hyp = turns(["a", "b", "c"]), turns(["p", "q", "r", "s"])
    err, der = frame_errors(ref, hyp), diarization_error_rate(ref, hyp)
    for kind in ("missed", "false_alarm", "confusion"):  # turn edges on 10 ms: the frames are exact
        assert err.seconds(kind) == pytest.approx(getattr(der, kind), abs=1e-6), kind


def test_the_png_draws_each_speaker_on_its_row_and_the_overlap(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    lay = timeline_png(REF, tmp_path / "r.png", duration=12.0)
    from PIL import Image

    assert Image.open(tmp_path / "r.png").text["Software"].startswith("normlab ")  # what made it, in the file
    img = matplotlib.image.imread(tmp_path / "r.png")[..., :3]  # rows, columns, RGB in [0, 1]
    assert img.shape[:2] == (lay.height, lay.width) and lay.rows == 3  # A, B, overlap

    def at(row, t):
        return img[lay.y(row), lay.x(t)]

    colour_a, colour_b, dark = _rgb(PALETTE[0]), _rgb(PALETTE[1]), _rgb(OVERLAP)
    for row, t, want in ((0, 1.5, colour_a), (0, 9.5, colour_a), (1, 5.5, colour_b), (1, 3.5, colour_b),
                         (2, 3.5, dark)):
        assert np.abs(at(row, t) - want).max() < 0.02, (row, t, at(row, t))
    for row, t in ((0, 6.3), (1, 1.3), (1, 9.5), (2, 1.3), (2, 6.3), (0, 11.3)):  # silence: background
        assert at(row, t).min() > 0.8, (row, t, at(row, t))


class _Sections(html.parser.HTMLParser):
    """The page's table cells and the raw text of each inline SVG."""

    def __init__(self, page):
        super().__init__()
        self.cells, self.svgs, self.wraps, self._cell = [], [], [], None
        self.feed(page)
        self.svgs = [page[a : page.index("</svg>", a) + 6] for a in range(len(page)) if page.startswith("<svg", a)]

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div":
            self.wraps.append(attrs.get("class"))
        if tag in ("td", "th"):
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append(self._cell.strip())
            self._cell = None


def _result(ref, hyp):
    from normlab.diarization.metrics.evaluate import _as_dict

    row = {c: _as_dict(diarization_error_rate(ref, hyp, collar=float(c))) for c in ("0", "0.25")}
    return {"files": [{"uri": "r", "collars": row}], "total": row, "errors": {}, "out": "unused"}


def test_names_are_drawn_as_written_not_as_math(tmp_path):
    """matplotlib read "$...$" in a speaker's name or the uri as a formula: "$x^2$" was drawn as x squared, and
    "$\\bad$" raised ValueError, which stopped diarize_files(plot=True) at that file (RTTM allows both)."""
    pytest.importorskip("matplotlib")
    turns = [Turn("m$\\bad$", 0.0, 1.0, "$x^2$"), Turn("m$\\bad$", 0.5, 2.0, "$\\bad$")]
    timeline_png(turns, tmp_path / "t.png", duration=3.0)
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_the_page_has_the_table_and_aligned_rows_with_the_errors_by_kind():
    page = evaluation_page(_result(REF, HYP), {"r": REF}, {"r": HYP})
    parsed = _Sections(page)
    der0 = diarization_error_rate(REF, HYP)
    assert f"{100 * der0.der:.2f}%" in parsed.cells and "total" in parsed.cells
    assert "table-wrap" in parsed.wraps and "overflow-x: auto" in page
    (svg,) = parsed.svgs
    root = ET.fromstring(svg)
    rows = root.findall(f"{SVG}g")
    by = {}
    for g in rows:
        by.setdefault(g.get("class"), []).append(g)
    assert [g.get("data-speaker") for g in by["row reference"]] == ["A", "B"]  # one row per speaker
    assert [(g.get("data-speaker"), g.get("data-maps-to")) for g in by["row hypothesis"]] == \
        [("x", "A"), ("y", "B"), ("z", None)]
    spans = {g.get("data-kind"): [(float(r.get("data-start")), float(r.get("data-end")))
                                  for r in g.findall(f"{SVG}rect")]
             for g in by["row error"]}
    assert spans == {"missed": [(3.0, 4.0), (9.0, 10.0)], "false_alarm": [(11.0, 12.0)], "confusion": [(4.0, 5.0)]}
    fills = {g.get("data-kind"): {r.get("fill") for r in g.findall(f"{SVG}rect")} for g in by["row error"]}
    assert fills == {k: {ERROR_COLOURS[k]} for k in ERROR_COLOURS}
    # aligned: a turn starts at the same x in its row whatever the row (reference A and hypothesis x at 0 s)
    first = lambda g: float(g.find(f"{SVG}rect").get("x"))  # noqa: E731
    assert first(by["row reference"][0]) == first(by["row hypothesis"][0])
    # hypothesis turns take the colour of the reference speaker they are mapped to
    fill = by["row reference"][0].find(f"{SVG}rect").get("fill")
    assert by["row hypothesis"][0].find(f"{SVG}rect").get("fill") == fill
    # the ticks cover the recording: 12 s
    assert "12" in [t.text for t in root.find(f"{SVG}g").findall(f"{SVG}text")]


def test_without_matplotlib_plot_is_one_line_naming_the_extra(no_matplotlib, tmp_path):
    with pytest.raises(ImportError, match=r"^timeline plots need matplotlib: pip install 'normlab\[plot\]'$"):
        timeline_png(REF, tmp_path / "x.png")


def test_the_title_counts_overlapped_speech_once_and_names_a_recording_without_turns(tmp_path, monkeypatch):
    """The title read 26.3 s of speech where the command line said 22.4 s (overlap counted per speaker), and a
    recording without turns was titled "recording"."""
    from normlab.diarization.pipeline import api
    from normlab.diarization.pipeline.output import Diarization
    from normlab.diarization.plot import timeline_title

    turns = [Turn("m", 0.0, 4.0, "a"), Turn("m", 3.0, 3.0, "b")]
    assert timeline_title(turns) == "m: 2 speakers, 6.0 s of speech, 1.0 s overlapped"
    assert timeline_title([], "silence") == "silence: 0 speakers, 0.0 s of speech, 0.0 s overlapped"
    drawn = {}
    api._draw(lambda turns, path, **kw: drawn.update(kw), Diarization([], uri="silence", duration=2.0), {},
              tmp_path / "silence.png")
    assert drawn["uri"] == "silence"
