"""``normlab diarize evaluate --html DIR``: one page, ``DIR/index.html``, with what the evaluation found.

The per-file and total DER table (each collar: DER, false alarm, missed, confusion), then per recording
its timelines as inline SVG, aligned on one time axis: the reference speakers' rows, the hypothesis
speakers' rows (each under the colour of the reference speaker DER maps it to), and three rows with the
errors of each kind (``frame_errors``: 10 ms frames, collar 0). No script, no external file, no
matplotlib; tables and timelines scroll sideways inside their boxes on a narrow screen.
"""
from __future__ import annotations

import html
import json
import pathlib

from ... import written
from ..._checks import BadValue
from ..io.rttm import Turn
from ..plot import ERROR_COLOURS, PALETTE, speakers_in_order
from .frame_errors import KINDS, FrameErrors, frame_errors

LABELS = {"missed": "missed", "false_alarm": "false alarm", "confusion": "confusion"}
UNMAPPED = "#9e9e9e"
WIDTH, LABEL_W, ROW_H, GAP, AXIS_H = 1000, 190, 22, 10, 28
LABEL_CHARS = 27  # what fits in LABEL_W at 12 px; longer labels are cut, the full one is the row's tooltip

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; color: #222; }
main { max-width: 1100px; margin: 0 auto; padding: 12px; }
.table-wrap, .timeline-wrap { overflow-x: auto; -webkit-overflow-scrolling: touch; max-width: 100%; }
table { border-collapse: collapse; white-space: nowrap; }
th, td { padding: 4px 10px; text-align: right; border-bottom: 1px solid #e3e3e3; }
th:first-child, td:first-child { text-align: left; }
tr.total td { font-weight: 600; border-top: 2px solid #888; }
.timeline-wrap svg { min-width: 720px; width: 100%; height: auto; display: block; }
.legend span { display: inline-block; margin-right: 14px; max-width: 100%; }
h3 { overflow-wrap: anywhere; }
th[colspan] { text-align: center; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
.errors { color: #b00020; }
"""


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def der_table(result: dict) -> str:
    """The per-file and total table of ``evaluate_folder``'s result (one column group per collar)."""
    collars = list(result["total"])
    head1 = "<th rowspan=2>recording</th><th rowspan=2>speech (s)</th>" + "".join(
        f"<th colspan=4>collar {html.escape(c)} s</th>" for c in collars) + "<th rowspan=2>speakers (ref / hyp)</th>"
    head2 = "<th>DER</th><th>false alarm</th><th>missed</th><th>confusion</th>" * len(collars)

    def cells(by_collar: dict) -> str:
        out = []
        for c in collars:
            r, t = by_collar[c], by_collar[c]["total"]
            out += [_pct(r["der"])] + [_pct(r[k] / t if t else None) for k in ("false_alarm", "missed", "confusion")]
        return "".join(f"<td>{v}</td>" for v in out)

    def count(f: dict) -> str:
        n = f.get("speakers")
        return f"<td>{n['reference']} / {n['hypothesis']}</td>" if n else "<td></td>"

    rows = [f"<tr><td><a href=\"#{html.escape(f['uri'])}\">{html.escape(f['uri'])}</a></td>"
            f"<td>{f['collars'][collars[0]]['total']:.1f}</td>{cells(f['collars'])}{count(f)}</tr>"
            for f in result["files"]]
    right = result.get("count_right")
    agree = "" if right is None else f"right on {right} of {len(result['files'])}"
    rows.append(f"<tr class=total><td>total</td><td>{result['total'][collars[0]]['total']:.1f}</td>"
                f"{cells(result['total'])}<td>{agree}</td></tr>")
    return (f"<div class=table-wrap><table class=der><thead><tr>{head1}</tr><tr>{head2}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _tick_step(duration: float) -> float:
    return next((s for s in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200) if duration / s <= 10), 3600)


def timeline_svg(reference: list[Turn], hypothesis: list[Turn], errors: FrameErrors, duration: float) -> str:
    """Reference rows, hypothesis rows and one row per error kind over ``[0, duration]`` seconds, as SVG."""
    duration = duration if duration > 0 else 1.0
    refs = speakers_in_order(reference)
    colour = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(refs)}
    hyps = sorted(speakers_in_order(hypothesis),
                  key=lambda h: (refs.index(errors.mapping[h]) if h in errors.mapping else len(refs)))
    rows: list[tuple[str, str, dict, list]] = []  # (css class, label, attributes, [(start, end, fill, title)])
    for s in refs:
        rows.append(("row reference", f"ref {s}", {"data-speaker": s},
                     [(t.start, t.end, colour[s], s) for t in reference if t.speaker == s]))
    for h in hyps:
        ref = errors.mapping.get(h)
        rows.append(("row hypothesis", f"hyp {h}" + (f" = {ref}" if ref else ""),
                     {"data-speaker": h, **({"data-maps-to": ref} if ref else {})},
                     [(t.start, t.end, colour.get(ref, UNMAPPED), h) for t in hypothesis if t.speaker == h]))
    for kind in KINDS:
        rows.append(("row error", LABELS[kind], {"data-kind": kind},
                     [(a, b, ERROR_COLOURS[kind], LABELS[kind]) for a, b in errors.spans(kind)]))
    scale = (WIDTH - LABEL_W - 10) / duration
    parts, y = [], 0
    for i, (cls, label, attrs, spans) in enumerate(rows):
        if i in (len(refs), len(refs) + len(hyps)):
            y += GAP  # reference | hypothesis | errors
        kind = attrs.get("data-kind")
        a = "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())
        rects = "".join(
            f'<rect class="{"error " + kind if kind else "turn"}" x="{LABEL_W + s * scale:.2f}" y="{y + 3}" '
            f'width="{max((e - s) * scale, 0.5):.2f}" height="{ROW_H - 6}" fill="{fill}" data-start="{s:.3f}" '
            f'data-end="{e:.3f}"><title>{html.escape(title)} {s:.2f}-{e:.2f} s</title></rect>'
            for s, e, fill, title in spans)
        short = label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "\u2026"
        parts.append(f'<g class="{cls}"{a}><text x="4" y="{y + ROW_H - 7}" font-size="12">{html.escape(short)}'
                     f'<title>{html.escape(label)}</title></text>'
                     f'<line x1="{LABEL_W}" x2="{WIDTH - 10}" y1="{y + ROW_H / 2}" y2="{y + ROW_H / 2}" '
                     f'stroke="#eeeeee"/>{rects}</g>')
        y += ROW_H
    step = _tick_step(duration)
    ticks, t = [], 0.0
    while t <= duration + 1e-9:
        x = LABEL_W + t * scale
        ticks.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="0" y2="{y + 4}" stroke="#dddddd"/>'
                     f'<text x="{x:.2f}" y="{y + 18}" font-size="11" text-anchor="middle">{t:g}</text>')
        t += step
    height = y + AXIS_H
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" role="img" aria-label="reference, hypothesis and errors over '
            f'{duration:.1f} s"><g class="axis">{"".join(ticks)}<text x="4" y="{y + 18}" font-size="11">time (s)</text>'
            f'</g>{"".join(parts)}</svg>')


def _legend() -> str:
    items = [f'<span><i class=swatch style="background:{ERROR_COLOURS[k]}"></i>{LABELS[k]}</span>' for k in KINDS]
    return (f"<p class=legend>{''.join(items)}<span><i class=swatch style=\"background:{UNMAPPED}\"></i>"
            "hypothesis speaker mapped to no reference speaker</span></p>")


def evaluation_page(result: dict, reference: dict[str, list[Turn]], hypothesis: dict[str, list[Turn]],
                    uem: dict | None = None) -> str:
    """The page's HTML."""
    sections = []
    for f in result["files"]:
        u = f["uri"]
        ref, hyp = reference.get(u, []), hypothesis.get(u, [])
        region = None if uem is None else uem.get(u, [])
        err = frame_errors(ref, hyp, uem=region)
        end = max([t.end for t in ref + hyp] + [b for _, b in region or []] + [0.0])
        sums = ", ".join(f"{LABELS[k]} {err.seconds(k):.2f} s" for k in KINDS)
        sections.append(
            f'<section id="{html.escape(u)}"><h3>{html.escape(u)}</h3><p>DER {_pct(f["collars"]["0"]["der"])} at '
            f"collar 0 over {f['collars']['0']['total']:.1f} s of reference speech; per 10 ms frame: {sums}.</p>"
            f"<div class=timeline-wrap>{timeline_svg(ref, hyp, err, end)}</div></section>")
    errors = "".join(f"<li>{html.escape(p)}: {html.escape(e)}</li>" for p, e in result["errors"].items())
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content=\"width=device-width, initial-scale=1\">"
            f"<title>Diarization: DER of {len(result['files'])} recordings</title><style>{CSS}</style></head>"
            "<body><main>"
            f"<h1>Diarization error rate</h1><p>{len(result['files'])} recordings. DER = (false alarm + missed + "
            "confusion) / reference speech, overlap counted per speaker; the collar is forgiven on each side of "
            f"every reference boundary.</p>{der_table(result)}"
            + (f"<h2>Errors</h2><ul class=errors>{errors}</ul>" if errors else "")
            + (f"<p>Not in the reference, not scored: {html.escape(', '.join(result['unscored']))}.</p>"
               if result.get("unscored") else "")
            + (f"<p>Without a region in the UEM, not scored: {html.escape(', '.join(result['outside_uem']))}.</p>"
               if result.get("outside_uem") else "")
            + (f"<p>In the reference without an audio file, not scored: "
               f"{html.escape(', '.join(result['no_audio']))}.</p>" if result.get("no_audio") else "")
            + (f"<p>Reference speech after the audio's end, scored as missed: "
               f"{html.escape(', '.join(f'{u} (reference to {v})' for u, v in result['past_end'].items()))}.</p>"
               if result.get("past_end") else "")
            + "<h2>Timelines</h2><p>Per recording: the reference speakers, the hypothesis speakers (coloured as "
            "the reference speaker DER maps them to), and where the errors are, per 10 ms frame at collar 0.</p>"
            f"{_legend()}{''.join(sections)}{_made(result)}</main></body></html>\n")


def _made(result: dict) -> str:
    """What made the hypotheses: normlab's version and the segmentation model's file and SHA-256."""
    prov = result.get("provenance")
    if not prov:
        return ""
    model = (prov.get("pipeline") or {}).get("model") or {}
    return (f"<p class=made>Made with normlab {html.escape(str(prov.get('normlab')))} (torch "
            f"{html.escape(str(prov.get('torch')))}), segmentation model {html.escape(str(model.get('file')))} "
            f"(SHA-256 {html.escape(str(model.get('sha256')))}); settings "
            f"<code>{html.escape(json.dumps(result.get('settings'), sort_keys=True))}</code>; command "
            f"<code>{html.escape(str(prov.get('argv')))}</code>.</p>")


def page_path(out_dir) -> pathlib.Path:
    """Where :func:`write_evaluation_page` writes (one line if ``out_dir`` is a file, not a folder)."""
    out = pathlib.Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadValue(f"--html {out}: a file, not a folder")
    return out / "index.html"


def write_evaluation_page(result: dict, reference: dict[str, list[Turn]], hypothesis: dict[str, list[Turn]],
                          out_dir, *, uem: dict | None = None) -> pathlib.Path:
    """Write ``out_dir/index.html`` for ``evaluate_folder``'s ``result``, from the turns it scored (an RTTM left
    in ``result["out"]`` by an earlier run of a file that failed now was drawn) and its UEM's regions."""
    page = page_path(out_dir)
    page.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(page, evaluation_page(result, reference, hypothesis, uem))
    return page
