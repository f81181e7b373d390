"""``normlab report``: run every study, write results.json, index.html and the store; print verdicts."""
from __future__ import annotations

import base64
import contextlib
import html
import json
import os
import pathlib
import time

from .. import provenance, written
from .._checks import BadValue, CellsFailed
from ..locks import folder_lock
from ..progress import Progress
from . import STUDIES, load
from .base import Context, figure_file, pyplot
from .runner import Runner, Store


def run_studies(out: str | pathlib.Path, scale: str = "quick", jobs: int = 1, only: list[str] | None = None,
                progress: bool = True, executor: str = "local", address: str | None = None,
                device: str = "cpu", seed_offset: int = 0, overwrite: bool = False) -> dict:
    """Run the studies (all, or ``only``) into ``out``; returns the results.json content.

    ``executor``/``address``: where the cells run (:class:`Runner`); ``device``: the torch device of the cells;
    ``seed_offset``: shifts every seed (a rerun on a disjoint seed set). An ``index.html`` or ``results.json``
    already in ``out`` that normlab did not write stops it before any work (:mod:`normlab.written`), unless
    ``overwrite``.
    """
    out = pathlib.Path(out)
    pyplot()  # without matplotlib: one error before any work (each study draws its figure last)
    if executor == "ray":  # before the folder and its store are made
        from .ray_executor import check_ready

        check_ready(address)
    figures = [out / "figures" / figure_file(name) for name in dict.fromkeys(only or STUDIES)]  # what this run draws
    _joined(out / "results.json", only, scale, seed_offset, device, overwrite)  # before a folder is made
    written.check([out / "results.json", out / "index.html", *figures], overwrite=overwrite,
                  hint="give --out another folder")
    written.writable_folder(out)  # a read-only folder: one line with a way out, not the lock file's OS error
    written.writable_folder(out / "figures")  # a file of that name was found after all the cells had run
    metrics = out / "metrics"  # the training cells' curves: made by the first that has one, so checked here
    if metrics.exists() and not metrics.is_dir():  # (found after the first cells ran, which were then lost)
        raise BadValue(f"{metrics} is a file, not a folder (the studies' training curves go there): move it "
                       "away, or give --out another folder")
    # one report at a time in a folder: two wrote results.json from what each read at its start (one's claims
    # lost), and one could find the other's store half made
    with folder_lock(out, "written", "wait for that report to finish, or give --out another folder"):
        return _run_studies(out, scale, jobs, only, progress, executor, address, device, seed_offset, overwrite)


def _run_studies(out: pathlib.Path, scale: str, jobs: int, only: list[str] | None, progress: bool, executor: str,
                 address: str | None, device: str, seed_offset: int, overwrite: bool) -> dict:
    old = _joined(out / "results.json", only, scale, seed_offset, device, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(str(out / "runs.sqlite"))
    runner = Runner(store, jobs=jobs, progress=Progress(enabled=None if progress else False), executor=executor,
                    address=address, device=device)
    prov = provenance.record()
    store.add_session(dict(prov, executor=executor, jobs=jobs, device=str(device)))
    # figures are drawn into a staging folder and moved beside results.json only when it is written: a run
    # killed (or with failed cells) after some studies drew theirs left figures that the next report's page
    # showed beside the verdicts of the run before
    ctx = Context(runner, scale, out / "figures" / STAGING, seed_offset=seed_offset, root=out)
    studies, failed, t0 = [], [], time.time()
    try:
        for name in dict.fromkeys(only or STUDIES):  # each once, however often it was named
            t = time.time()
            try:
                res = load(name).run(ctx)
            except CellsFailed as e:  # the other studies still run; no verdict is drawn from a failed cell
                failed.append(str(e))
                continue
            res["seconds"] = round(time.time() - t, 1)
            # this study's own run: a study kept from an earlier report keeps the code and versions that made it
            res["run"] = {"executor": executor, "jobs": jobs, "threads_per_cell": runner.threads,
                          **{k: prov.get(k) for k in ("normlab", "torch", "python", "git_commit", "source_digest")}}
            studies.append(res)
    finally:
        runner.close()
    if failed:  # results.json and index.html stay as they were: a report without these studies would read whole
        raise CellsFailed(failed[0] if len(failed) == 1 else
                          f"{len(failed)} studies had failed cells; {'; '.join(failed)}")
    claims = [dict(c, study=s["name"]) for s in studies for c in s["claims"]]
    for s in studies:
        if s.get("figure"):
            s["figure_sha256"] = _publish(out / "figures", s["figure"])
    _unstage(out / "figures")
    summaries = [{k: s.get(k) for k in ("name", "title", "figure", "figure_sha256", "seconds", "table", "run")}
                 for s in studies]
    if old:  # some studies re-run: keep the others' claims, in report order
        fresh = {s["name"] for s in studies}
        summaries += [s for s in old.get("studies", []) if s["name"] not in fresh]
        claims += [c for c in old.get("claims", []) if c.get("study") not in fresh]
        order = {name: i for i, name in enumerate(STUDIES)}
        summaries.sort(key=lambda s: order.get(s["name"], len(order)))
        claims.sort(key=lambda c: order.get(c["study"], len(order)))
    result = {"scale": scale, "seconds": round(time.time() - t0, 1), "cells_computed": runner.ran,
              "seed_offset": seed_offset, "executor": executor, "jobs": jobs, "device": str(device), "provenance": prov,
              "claims": claims, "studies": summaries}
    text, page = json.dumps(result, indent=2) + "\n", render_html(result, out / "figures")

    def both(tmp: pathlib.Path) -> None:  # results.json's new text waits in tmp while the page is written whole:
        tmp.write_text(text, encoding="utf-8")  # a page that cannot be written (a full disk) leaves both old
        written.write_text(out / "index.html", page)

    written.write_with(out / "results.json", both)
    return result


#: the folder under ``figures`` where a run's studies draw until the report is written
STAGING = ".drawing"


def _publish(figures: pathlib.Path, name: str) -> str:
    """Move a figure this run drew from the staging folder into ``figures``; returns its SHA-256."""
    staged = figures / STAGING / name
    written.write_with(figures / name, lambda tmp: os.replace(staged, tmp))
    return written.digest(figures / name)


def _unstage(figures: pathlib.Path) -> None:
    """Remove the staging folder once this run's figures are published, with what killed runs drew there (files
    normlab wrote and nobody changed since; anything else stays, and the folder with it)."""
    staging = figures / STAGING
    for name in written.listed(staging):
        with contextlib.suppress(BadValue, OSError):
            written.check([staging / name])
            (staging / name).unlink(missing_ok=True)
    (staging / written.LIST).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        staging.rmdir()


def _joined(previous: pathlib.Path, only: list[str] | None, scale: str, seed_offset: int, device,
            overwrite: bool) -> dict:
    """The report in ``previous`` that a run of ``only`` these studies joins ({} for a whole run, or none); one
    line where it cannot be joined (another scale, seed offset or device: it would mix them) or it is another
    normlab command's ``results.json`` (a training run's: "holds a None report", or a whole report replaced
    it without a word), unless ``overwrite``."""
    old = _previous(previous)
    if old is None:
        if written.ours(previous) and not overwrite:
            raise BadValue(f"{previous} is another normlab command's output, not a report: give --out another "
                           "folder, or --overwrite to replace it")
        return {}
    if not only:
        return {}
    theirs = (old.get("scale"), old.get("seed_offset", 0), old.get("device", "cpu"))
    if theirs != (scale, seed_offset, str(device)):  # would mix two settings (or CPU and GPU verdicts)
        if not overwrite:
            raise BadValue(f"{previous} holds a {theirs[0]} report with seed offset {theirs[1]} on {theirs[2]}; a "
                           f"{scale} run with seed offset {seed_offset} on {device} of some studies cannot join it: "
                           "give --out another folder, the same scale, seed offset and device, or --overwrite to "
                           "replace it")
        return {}
    return old


def _previous(path: pathlib.Path) -> dict | None:
    """The report already in ``path``: None where there is none, or it is not a report normlab wrote (replaced,
    with --overwrite: a foreign file's claims were published beside the run's as normlab's verdicts)."""
    if not written.ours(path):
        return None
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return old if isinstance(old, dict) and isinstance(old.get("claims"), list) and "scale" in old else None


def verdict_table(result: dict) -> str:
    rows = [f"{'id':<4s} {'verdict':<7s} {'study':<13s} statement / seed-level uncertainty"]
    for c in result["claims"]:
        rows.append(f"{c['id']:<4s} {c['verdict']:<7s} {c['study']:<13s} {c['statement'][:90]}")
        if c.get("uncertainty"):
            rows.append(f"{'':<26s} uncertainty: {c['uncertainty']}")
    n = {v: sum(c["verdict"] == v for c in result["claims"]) for v in ("PASS", "FAIL", "SKIP")}
    rows.append(f"{n['PASS']} passed, {n['FAIL']} failed" + (f", {n['SKIP']} skipped" if n["SKIP"] else ""))
    return "\n".join(rows)


def study_tables(result: dict) -> str:
    """The studies' own tables as Markdown, each under its study's title ('' if none has one)."""
    out = []
    for s in result["studies"]:
        t = s.get("table")
        if t:
            out += [f"{s['title']}", "| " + " | ".join(map(str, t["columns"])) + " |",
                    "|" + "---|" * len(t["columns"])]
            out += ["| " + " | ".join(map(str, row)) + " |" for row in t["rows"]]
    return "\n".join(out)


def _img(path: pathlib.Path, sha256: str | None = None) -> str:
    """The figure embedded, unless it is not the one its study's run drew (``sha256``, where recorded)."""
    if not path.exists():
        return "<p><em>(no figure)</em></p>"
    if sha256 is not None and written.digest(path) != sha256:
        return (f"<p><em>({html.escape(path.name)} is not the figure of this run of the study: run the study again "
                "with --overwrite (normlab study, or normlab report --only) to draw it, or move this file away)"
                "</em></p>")
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _table(table: dict) -> str:
    """A study's own table: ``{"columns": [...], "rows": [[...], ...]}``."""
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in table["columns"])
    rows = "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in row) + "</tr>" for row in table["rows"])
    return f"<table><tr>{head}</tr>{rows}</table>"


def render_html(result: dict, figures: pathlib.Path) -> str:
    e = html.escape
    n_pass = sum(c["verdict"] == "PASS" for c in result["claims"])
    head = (
        "<!doctype html><html><head><meta charset='utf-8'><title>normlab report</title><style>"
        "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;width:100%;font-size:13px}td,th{border:1px solid #ccc;padding:4px 6px;"
        "vertical-align:top}th{background:#f3f3f3}.PASS{color:#0a0;font-weight:bold}.FAIL{color:#c00;font-weight:bold}.SKIP{color:#888;"
        "font-weight:bold}img{max-width:100%;border:1px solid #ddd}code{font-size:12px;word-break:break-all}"
        "</style></head><body>"
    )
    parts = [head, "<h1>normlab report</h1>",
             f"<p>{n_pass} of {len(result['claims'])} claims PASS &middot; scale <b>{e(result['scale'])}</b> &middot; "
             f"{result['seconds']} s &middot; {result['cells_computed']} cells computed in this run "
             "(the rest came from <code>runs.sqlite</code>)</p>",
             f"<p><small>{e(provenance.describe(result['provenance']))}</small></p>"
             if result.get("provenance") else "",
             "<table><tr><th>id</th><th>verdict</th><th>claim</th><th>source</th><th>criterion</th><th>measured</th>"
             "<th>seed-level uncertainty</th></tr>"]
    for c in result["claims"]:
        parts.append(
            f"<tr><td>{e(c['id'])}</td><td class='{c['verdict']}'>{c['verdict']}</td><td>{e(c['statement'])}</td>"
            f"<td>{e(c['source'])}</td><td>{e(c['criterion'])}</td><td><code>{e(json.dumps(c['measured']))}</code></td>"
            f"<td>{e(c.get('uncertainty', ''))}</td></tr>"
        )
    parts.append("</table>")
    for s in result["studies"]:
        ids = ", ".join(c["id"] for c in result["claims"] if c["study"] == s["name"])
        parts.append(f"<h2>{e(s['title'])}</h2><p>claims {e(ids)} &middot; {s['seconds']} s</p>")
        if s.get("table"):
            parts.append(_table(s["table"]))
        parts.append(_img(figures / s["figure"], s.get("figure_sha256")) if s.get("figure") else "")
    parts.append("</body></html>")
    return "\n".join(parts)
