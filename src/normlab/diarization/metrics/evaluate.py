"""A model on a simulated folder: frame probabilities once, then DER for any post-processing.

``frame_probs`` runs the model on a whole recording with its own speakers
only (at most ``n_speakers``; no clustering): chunks of ``chunk_frames``
output frames that overlap by ``overlap_frames``; EEND's speaker order is
arbitrary per chunk, so each chunk's speaker columns are permuted to agree
best with what is decided on the overlap before the chunks are joined.

``tune`` chooses the threshold and median-filter width on a development
folder (never on the test folder); ``evaluate`` scores one setting.
"""
from __future__ import annotations

import pathlib
from collections.abc import Iterable

import torch

from ... import written
from ..._checks import BadValue, NotFound
from ..data.dataset import MixtureSet
from ..io.rttm import Turn, read_rttm, speaker_count
from ..models.eend import EENDModel
from ..pipeline.postprocess import to_turns
from ..training.permutation import align
from .der import DERResult, score

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
MEDIANS = (1, 5, 11, 21)


@torch.no_grad()
def frame_probs(model: EENDModel, feats: torch.Tensor, chunk_frames: int = 1500,
                overlap_frames: int = 100) -> torch.Tensor:
    """Speaker probabilities ``(frames, speakers)`` for features ``(frames, dim)``."""
    if overlap_frames >= chunk_frames:
        raise BadValue(f"overlap_frames ({overlap_frames}) must be smaller than chunk_frames ({chunk_frames})")
    model.eval()
    n = feats.shape[0]
    s = model.cfg.n_speakers
    if n == 0:
        return torch.zeros(0, s)
    device = next(model.parameters()).device  # inference follows the model's device; probabilities on the CPU
    out = model.activity(feats[None, :chunk_frames].to(device))[0].cpu()  # T0, S
    start = chunk_frames - overlap_frames
    while out.shape[0] < n:
        p = model.activity(feats[None, start : start + chunk_frames].to(device))[0].cpu()  # Tc, S
        ov = out.shape[0] - start  # frames shared with what is already decided
        p = align(out, p, ov)  # this chunk in the speaker order of what is decided
        out = torch.cat([out[:start], (out[start:] + p[:ov]) / 2, p[ov:]])
        start += chunk_frames - overlap_frames
    return out[:n]


def folder_probs(model: EENDModel, folder: str | pathlib.Path) -> dict[str, torch.Tensor]:
    """``{uri: (frames, speakers) probabilities}`` for every mixture of a simulated folder."""
    data = MixtureSet(folder, n_speakers=model.cfg.n_speakers)
    return {uri: frame_probs(model, feats) for uri, (feats, _) in zip(data.uris, data.items)}


def _hypothesis(probs: dict[str, torch.Tensor], threshold: float, median: int,
                frame_seconds: float) -> dict[str, list[Turn]]:
    return {uri: to_turns(p, frame_seconds, uri, threshold=threshold, median=median) for uri, p in probs.items()}


def evaluate(probs: dict[str, torch.Tensor], reference: dict[str, list[Turn]], *, threshold: float, median: int,
             collar: float = 0.25, frame_seconds: float = 0.1) -> DERResult:
    """DER of the thresholded, median-filtered probabilities against ``reference``."""
    missing = sorted(set(probs) - set(reference))
    if missing:
        raise BadValue(f"no reference turns for {len(missing)} recordings, e.g. {missing[0]!r}")
    hyp = _hypothesis(probs, threshold, median, frame_seconds)
    return score({u: reference[u] for u in probs}, hyp, collar=collar)


def tune(probs: dict[str, torch.Tensor], reference: dict[str, list[Turn]], *, collar: float = 0.25,
         thresholds: Iterable[float] = THRESHOLDS, medians: Iterable[int] = MEDIANS,
         frame_seconds: float = 0.1) -> tuple[dict, list[dict]]:
    """The (threshold, median) with the lowest DER, and every grid point's DER (ties: the earlier point)."""
    grid = []
    for th in thresholds:
        for med in medians:
            r = evaluate(probs, reference, threshold=th, median=med, collar=collar, frame_seconds=frame_seconds)
            grid.append({"threshold": th, "median": med, "der": r.der})
    best = min(grid, key=lambda g: g["der"])
    return {"threshold": best["threshold"], "median": best["median"]}, grid


def reference_of(folder: str | pathlib.Path) -> dict[str, list[Turn]]:
    """The ``ref.rttm`` written by ``normlab diarize simulate``."""
    return read_rttm(pathlib.Path(folder) / "ref.rttm")


COLLARS = (0.0, 0.25)
#: reference speech ending this much after its audio (seconds) is said: it is scored as missed, and the
#: reference may be another recording's, or the audio a cut copy
PAST_END_S = 1.0


def _audio_in(folder: pathlib.Path) -> list[pathlib.Path]:
    """The audio files of ``folder`` (a subfolder named like one, ``takes.wav/``, is not one)."""
    from ..io.audio import AUDIO_SUFFIXES

    return sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and not p.is_dir())


def evaluate_folder(wav_dir: str | pathlib.Path, ref_rttm: str | pathlib.Path, out_dir: str | pathlib.Path, *,
                    uem: str | pathlib.Path | None = None, html: str | pathlib.Path | None = None,
                    overwrite: bool = False, progress=None, **diarize_kw) -> dict:
    """Diarize every audio file of ``wav_dir`` (``io.audio.AUDIO_SUFFIXES``: WAV, FLAC, Ogg, MP3, AIFF, GSM) into
    ``out_dir``, then score the written RTTMs.

    Returns ``{"files": [{"uri", "collars": {"0": {...}, "0.25": {...}}, "speakers": {"reference": n,
    "hypothesis": m}}], "total": {...}, "count_right": k, "errors": {...}}`` with DER components in seconds
    and ``der`` as a fraction; ``count_right``: the files whose hypothesis has as many speakers as their
    reference (over the whole file, whatever the UEM; a file that failed has none); ``unscored``: the
    recordings the reference does not name, diarized but not scored (as ``diarize score`` skips them);
    ``outside_uem``: those the UEM gives no region of time (``io.uem.uncovered``), not scored;
    ``no_audio``: the reference's recordings without an audio file in ``wav_dir``, not scored (``diarize
    score`` would count them as all missed); ``past_end``: ``{uri: "reference end, audio length"}`` where the
    reference speaks more than :data:`PAST_END_S` after the audio ends (scored as missed). The RTTMs are read
    back before scoring, so the numbers are those
    of ``normlab diarize score REF OUT_DIR --collar C`` on the recordings that have audio; ``der`` is None
    where a recording has no reference speech to score. A reference without speech in the scored regions
    is refused before any work, as ``diarize score`` refuses it.
    ``html``: also write ``html/index.html`` (:func:`report_html.write_evaluation_page`; its path under
    ``"html"``). Outputs that exist already are replaced only where normlab wrote them (``overwrite``: any),
    checked before any work.
    """
    from ...provenance import record
    from ..io.audio import AUDIO_SUFFIXES, recording_uri
    from ..io.uem import read_uem, uncovered
    from ..pipeline.api import DONE, diarize_files, made_with

    # the RTTMs written are what is scored: another format wrote none, and stale RTTMs in out_dir were scored
    if diarize_kw.get("format", "rttm") != "rttm":
        raise BadValue(f"evaluate writes and scores RTTM files: format={diarize_kw['format']!r} is not one "
                       "(convert them afterwards)")
    wav_dir, out_dir = pathlib.Path(wav_dir), pathlib.Path(out_dir)
    if not wav_dir.is_dir():
        raise NotFound(f"{wav_dir} is not a folder")
    paths = _audio_in(wav_dir)
    if not paths and (wav_dir / "wav").is_dir():  # the layout simulate writes (and tune reads): DIR/wav/*.wav
        wav_dir = wav_dir / "wav"
        paths = _audio_in(wav_dir)
    if not paths:
        raise NotFound(f"{wav_dir} has no audio files ({', '.join(AUDIO_SUFFIXES)})")
    reference = read_rttm(ref_rttm)
    if not reference:  # (as diarize score says it)
        raise BadValue(f"nothing to score: {ref_rttm} has no speaker turns (no SPEAKER line)")
    uris = {recording_uri(p) for p in paths}
    if not set(reference) & uris:  # before any work: audio and reference do not meet
        some = ", ".join(sorted(reference)[:5]) or "none"
        raise BadValue(f"none of the {len(paths)} audio files of {wav_dir} is a recording of {ref_rttm} (its "
                       f"recordings: {some}{' ...' if len(reference) > 5 else ''})")
    regions = read_uem(uem) if uem else None
    if regions is not None and not set(regions) & set(reference) & uris:
        raise BadValue(f"{uem} covers none of the recordings of {wav_dir} that {ref_rttm} names: nothing would be "
                       "scored")
    ref = {u: reference[u] for u in uris if u in reference}  # what is scored: the recordings with audio
    if score(ref, {}, collar=0.0, uem=regions).total == 0:
        raise BadValue(f"nothing to score: the reference has no speech{' inside the UEM' if uem else ''} in the "
                       f"{len(ref)} recordings of {wav_dir} it names")
    inputs = {written.resolved(f): what for f, what in ((ref_rttm, "reference"), (uem, "UEM")) if f is not None}
    outputs = [out_dir / f"{u}.rttm" for u in sorted(uris)]
    if html is not None:
        from .report_html import page_path

        outputs.append(page_path(html))
    taken = next((o for o in outputs if written.resolved(o) in inputs), None)
    if taken is not None:  # even with overwrite: the command would score its own output
        raise BadValue(f"{taken} is the {inputs[written.resolved(taken)]} this evaluation reads, and an output "
                       f"would replace it: give another {'--html' if taken.suffix == '.html' else '--out'}")
    if html is not None:
        written.check([page_path(html)], overwrite=overwrite, hint="give --html another folder")
        written.writable_folder(page_path(html).parent, "--html")
    results = {}
    status = diarize_files(paths, out_dir, progress=progress, overwrite=overwrite, on_result=results.__setitem__,
                           **diarize_kw)
    # what the files were made with, as their results record it (the model and encoder loaded once); only where
    # every file failed are they loaded again to say it
    first = next(iter(results.values()), None)
    made = ({"settings": first.settings, "provenance": first.provenance} if first is not None else
            made_with(**{k: v for k, v in diarize_kw.items() if k not in ("format", "exclusive", "plot")}))
    hyp: dict[str, list[Turn]] = {}
    for p in paths:
        if status[str(p)] in DONE:
            hyp.update(read_rttm(out_dir / f"{recording_uri(p)}.rttm"))
    # as `diarize score`: a recording the reference does not name is diarized, listed, and not scored
    unscored = sorted(uris - set(reference))
    files, total = [], {}
    for u in sorted(ref):
        row = {"uri": u, "collars": {}, "speakers": {"reference": speaker_count(ref[u]),
                                                      "hypothesis": speaker_count(hyp.get(u, []))}}
        for c in COLLARS:
            r = score({u: ref[u]}, {u: hyp.get(u, [])}, collar=c, uem=regions)
            row["collars"][f"{c:g}"] = _as_dict(r)
        files.append(row)
    for c in COLLARS:
        total[f"{c:g}"] = _as_dict(score(ref, hyp, collar=c, uem=regions))
    # each failed file's error (its path said once, by the key) and what its failure did to the scores
    effect = lambda k: "scored as all missed" if reference.get(recording_uri(k)) else "not in the reference"  # noqa: E731
    errors = {k: f"{v.removeprefix(f'{k}: ')} ({effect(k)})" for k, v in status.items() if v not in DONE}
    right = sum(f["speakers"]["reference"] == f["speakers"]["hypothesis"] for f in files)
    # reference speech after the audio ends (another recording's reference, or a cut copy): scored as missed
    ends = {recording_uri(k): d.duration for k, d in results.items()}
    spoken = {u: max(t.end for t in ref[u]) for u in sorted(ref) if u in ends and ref[u]}
    past = {u: f"{end:.1f} s, audio {ends[u]:.1f} s" for u, end in spoken.items() if end > ends[u] + PAST_END_S}
    result = {"files": files, "total": total, "count_right": right, "unscored": unscored,
              "outside_uem": uncovered(ref, regions), "no_audio": sorted(set(reference) - uris), "past_end": past,
              "errors": errors, "out": str(out_dir),
              "settings": made["settings"], "provenance": {**record(), "pipeline": made["provenance"]}}
    if html is not None:
        from .report_html import write_evaluation_page

        result["html"] = str(write_evaluation_page(result, reference, hyp, html, uem=regions))
    return result


def _as_dict(r: DERResult) -> dict:
    """DER components in seconds; ``der`` None where there is no reference speech to score (a DER of nothing
    is not 0%)."""
    return {"der": r.der if r.total > 0 else None, "false_alarm": r.false_alarm, "missed": r.missed,
            "confusion": r.confusion, "total": r.total}


def _percent(der: float | None) -> str:
    return "      n/a" if der is None else f"{100 * der:8.2f}%"


def format_evaluation(result: dict) -> str:
    """Per-file and total DER at each collar and the speaker counts (reference / hypothesis), one table (the
    files that failed: :func:`format_errors`)."""
    cs = list(result["total"])
    w = max([24] + [len(row["uri"]) for row in result["files"]])  # whole names: two may share a long prefix
    head = f"{'recording':<{w}s}" + "".join(f"  DER@{c:<5s}" for c in cs) + "  speakers (ref/hyp)"
    lines = [head]
    for row in result["files"]:
        n = row["speakers"]
        lines.append(f"{row['uri']:<{w}s}" + "".join(f"  {_percent(row['collars'][c]['der'])}" for c in cs)
                     + f"  {n['reference']}/{n['hypothesis']}")
    lines.append(f"{'TOTAL':<{w}s}" + "".join(f"  {_percent(result['total'][c]['der'])}" for c in cs))
    lines.append(f"speaker count right on {result['count_right']} of {len(result['files'])} recordings")
    past = [f"{u} (reference to {v})" for u, v in (result.get("past_end") or {}).items()]
    for some, what in ((result.get("unscored"), "not in the reference, not scored"),
                       (result.get("outside_uem"), "without a region in the UEM, not scored"),
                       (result.get("no_audio"), "in the reference without an audio file in the folder, not scored"),
                       (past, "reference speech after the audio's end, scored as missed")):
        if some:
            lines.append(f"{what}: {len(some)} recordings ({', '.join(some[:5])}{' ...' if len(some) > 5 else ''})")
    return "\n".join(lines)


def format_errors(result: dict) -> str:
    """One line per file that could not be diarized: its path, the error and what its failure did to the scores."""
    return "\n".join(f"{path}: error: {err}" for path, err in result["errors"].items())
