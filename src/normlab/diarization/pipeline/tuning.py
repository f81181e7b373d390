"""Choose the pipeline's settings on a development set; score held-out sets once with the choice.

Segmentation (model + VAD + embeddings) runs once per segmentation setting
(mode, VAD use, threshold, piece, window step) and file; the clustering and
stitching settings are a grid over those segmentations. The dev choice
minimises total DER at collar 0.25 over every dev file together, in each mode.
The default mode is ``eend`` (the model's own local speakers, overlap kept)
unless ``speech`` mode's choice is better beyond doubt: lower DER in at least
95% of paired bootstrap resamples of the dev files (a tenth of a point on a
hundred files is noise, and only ``eend`` can say that two people talk at
once). Each held-out set is then
scored once with the choice and once with the best ``vad="speech"`` reading
(Silero alone decides speech), the comparison the model has to beat. Besides
DER the rows give the share of files whose speaker count is right and the
overlap precision (of the frames called overlap, the share that are overlap in
the reference).
"""
from __future__ import annotations

import itertools
import pathlib
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

from ..._checks import BadValue, NotFound
from ...workers import exit_on_interrupt
from ..io.audio import SAMPLE_RATE, read_mono, recording_uri
from ..io.rttm import Turn, read_rttm, speaker_count
from ..metrics.der import DERResult, diarization_error_rate, score
from .config import PipelineConfig
from .segment_cache import SegmentCache
from .stitch import segment, stitch

#: the settings each segmentation of the dev set is made with (model and embeddings run once per combination);
#: ``vad="gate"`` (Silero silences what it calls non-speech) read 30-31% on the dev conversations where the model
#: alone read 13-17% (docs/diarization.md), so it is not in the default grid: ``--grid vad=off,gate`` adds it;
#: ``vad="union"`` (speech where the model or Silero hears it) is a reading of the model, ``vad="speech"`` the
#: comparison it must beat
#: a 2.5 s window step read worse than 5 s in both modes (eend 14.51% vs 14.06%, speech 14.11% vs 13.48% on
#: the dev conversations) at twice the cost, so it is not in the default grid either: ``--grid step=5,2.5``
#: the threshold axis reaches 0.5: the shipped model chose 0.4, the grid's top then; at 0.5 it reads (CAM++)
#: 17.04% against 18.07% on dev (lower in 93% of resamples, not beyond doubt: it keeps 0.4; docs/diarization.md)
SEGMENT_GRID = {"speakers": ("eend", "speech"), "vad": ("off", "union", "speech"), "threshold": (0.2, 0.3, 0.4, 0.5),
                "piece": (1.5,), "step": (5.0,)}
#: the settings tried on each segmentation (clustering and stitching only: cheap)
STITCH_GRID = {"cluster_threshold": (0.3, 0.35, 0.4, 0.5), "min_cluster": (1.0, 2.0, 4.0, 8.0),
               "weighting": ("mean", "hamming"), "overlap_threshold": (0.5, 0.6, 0.7), "merge_threshold": (0.0,),
               "whiten": (False,),  # whitening: not in the default grid (docs/diarization.md); --grid whiten=false,true
               "fill_gap": (0.0,),  # filling pauses: not in the default grid (docs/diarization.md)
               "reassign": (True,),  # each piece to its nearest centroid (docs/diarization.md)
               "offset_threshold": (0.15,),  # turns held on through silence (docs/diarization.md); 1: off
               "clustering": ("ahc",), "vbx_fa": (0.2,), "vbx_fb": (1.0,), "vbx_dims": (64,)}
#: the axes only VBx reads (clustering="ahc" rows take each one's first value)
VBX_KEYS = ("vbx_fa", "vbx_fb", "vbx_dims")
KEYS = (*SEGMENT_GRID, *STITCH_GRID)
#: where the grid did not try whitened embeddings but the model file holds a whitening: each mode's chosen
#: segmentation is clustered whitened at these cuts and floors (whitening moves the cut: 0.25 against 0.35 for
#: the shipped model), the best stored for ``whiten=True`` (``postprocess["whitened"]``)
WHITENED_GRID = {"cluster_threshold": (0.15, 0.2, 0.25, 0.3, 0.35), "min_cluster": (2.0, 4.0, 8.0)}
#: where the grid did not try VBx but the model file holds a PLDA model: each mode's chosen segmentation is
#: clustered with VBx at these settings, the best stored for ``clustering="vbx"`` (``postprocess["vbx"]``; not
#: the default: docs/diarization.md; ``--grid clustering=ahc,vbx`` lets the dev set choose it). VBx starts from
#: the tree cut lower than the tree alone is cut
VBX_GRID = {"cluster_threshold": (0.25, 0.3, 0.35), "vbx_fa": (0.15, 0.2, 0.3), "vbx_fb": (0.7, 1.0, 2.0),
            "min_cluster": (4.0, 8.0)}
#: where other speaker encoders are given: each mode's chosen segmentation is made again with each at these
#: pieces and clustered at these cuts and floors (an encoder's embeddings have their own distances: CAM++'s
#: same-speaker cosine distances lie above GE2E's, and it reads longer pieces better), the best stored for
#: ``speaker_encoder=<name>`` (``postprocess["encoders"]``), and the mode's choice if lower beyond doubt
ENCODER_GRID = {"campplus": {"piece": (1.5, 3.0), "cluster_threshold": (0.55, 0.6, 0.625, 0.65, 0.7),
                             "min_cluster": (4.0, 8.0)}}
#: an encoder's settings within this much dev DER of its best are a tie, and the lowest cut among them is
#: taken: the cut decides the count, and where the dev set cannot tell two cuts apart, merging two people
#: (the higher cut) is the error a user cannot undo with --max-speakers (docs/diarization.md: CAM++'s cuts
#: 0.6 and 0.625 read 18.98% on dev, and the higher merged the one spontaneous real conversation)
ENCODER_TIE = 0.0005
#: the default mode unless the other is better beyond doubt (``share_better`` >= ``BEYOND_DOUBT``)
PREFERRED_MODE = "eend"
BEYOND_DOUBT = 0.95


def meaningful(kw: dict, stitch_grid: dict = STITCH_GRID) -> bool:
    """False for settings the pipeline ignores in that mode (they would repeat another row)."""
    if kw.get("speakers") == "eend" and kw.get("vad") == "speech":
        return False  # "speech" is a speech-mode reading; eend mode gates with the VAD instead
    if kw.get("clustering", "ahc") != "vbx" and any(kw[k] != stitch_grid[k][0] for k in VBX_KEYS if k in kw):
        return False  # the tree cut alone: VBx's settings do not matter
    if kw.get("clustering") == "vbx" and (kw.get("whiten") or kw.get("reassign", True) != stitch_grid.get(
            "reassign", (True,))[0]):
        return False  # VBx has its own model of the embeddings and its own assignment
    first = stitch_grid["overlap_threshold"][0]
    if kw.get("speakers") == "speech" and kw.get("overlap_threshold", first) != first:
        return False  # one speaker at a time: no second speaker to threshold
    return True


def parse_grid(items: list[str], grids: tuple[dict, dict]) -> tuple[dict, dict]:
    """``NAME=V1,V2`` replaces that axis of (a copy of) the segment or the stitch grid."""
    seg, st = dict(grids[0]), dict(grids[1])
    given = set()
    for item in items:
        name, _, values = item.partition("=")
        grid = seg if name in seg else st if name in st else None
        if grid is None or not values:
            raise BadValue(f"grid {item!r}: expected NAME=V1,V2 with NAME one of {sorted([*seg, *st])}")
        if name in given:  # the last one replaced the first without a word
            raise BadValue(f"grid {item!r}: a second {name} axis; give its values once, as {name}=V1,V2")
        given.add(name)
        kind = _flag if isinstance(grid[name][0], bool) else type(grid[name][0])
        try:
            grid[name] = tuple(_value(kind, v) for v in values.split(","))
            for v in grid[name]:  # each value on its own (a NaN cut would fail after the whole grid has run)
                PipelineConfig(**{name: v})
        except ValueError as e:
            raise BadValue(f"grid {item!r}: {e}") from None
        twice = sorted({str(v) for v in grid[name] if grid[name].count(v) > 1})
        if twice:  # each setting ran twice
            raise BadValue(f"grid {item!r}: {', '.join(twice)} given twice")
    return seg, st


def _value(kind, text: str):
    """``text`` as the axis's kind (float, int, bool or str); ValueError naming the value and what it must be."""
    try:
        return kind(text)
    except ValueError:
        if kind in (float, int):
            raise ValueError(f"{text!r} is not {'a number' if kind is float else 'a whole number'}") from None
        raise


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1")


def files_of(dirs: list) -> list[tuple[pathlib.Path, list[Turn]]]:
    """(audio, reference turns) of every ``DIR/wav/*.wav`` (or ``DIR/*.wav``) named in ``DIR/ref.rttm``
    (or, without it, in the folder's ``.rttm`` files together); a folder named twice counts once."""
    if any(not str(d).strip() for d in dirs):  # Path("") is the current folder: never what was meant
        raise BadValue("an empty folder name among the dev/test folders")
    out = []
    for d in dict.fromkeys(pathlib.Path(d).resolve() for d in dirs):
        rttms = [d / "ref.rttm"] if (d / "ref.rttm").is_file() else sorted(d.glob("*.rttm"))
        if not rttms:
            raise NotFound(f"{d}: no ref.rttm (a folder of wav/*.wav and ref.rttm, or *.wav with their .rttm)")
        ref: dict[str, list[Turn]] = {}
        for rttm in rttms:
            for uri, turns in read_rttm(rttm).items():
                ref.setdefault(uri, []).extend(turns)
        wavs = sorted((d / "wav").glob("*.wav")) if (d / "wav").is_dir() else sorted(d.glob("*.wav"))
        out += [(w, ref.get(recording_uri(w), [])) for w in wavs if recording_uri(w) in ref]
    return out


def unique_recordings(files: list, what: str) -> list:
    """``files`` (of :func:`files_of`), where no two recordings share a name; else one line naming both: results
    and references are keyed by the recording's name, and one folder's recording silently stood for the other's."""
    seen: dict[str, pathlib.Path] = {}
    for wav, _ in files:
        uri = recording_uri(wav)
        if uri in seen:
            raise BadValue(f"{what}: two recordings named {uri!r} ({seen[uri]} and {wav}): each recording's name "
                           "must be its own across the folders (rename one, or simulate with another --seed)")
        seen[uri] = wav
    return files


def _has_speech(files: list) -> bool:
    """Whether any reference of ``files`` (of :func:`files_of`) holds speech."""
    return any(t.duration > 0 for _, ref in files for t in ref)


def _scorable(files: list, what: str, dirs) -> list:
    """``files`` (of :func:`files_of`), where some of their references hold speech; else one line naming them."""
    if not _has_speech(files):
        raise NotFound(f"{what}: no recordings with reference speech in {[str(d) for d in dirs]} (each wav named "
                       "in its folder's ref.rttm, with SPEAKER turns)")
    return files


def overlap_precision(ref: list[Turn], hyp: list[Turn], step: float = 0.01) -> tuple[float, float]:
    """(frames the hypothesis calls overlap that are reference overlap, frames it calls overlap)."""
    end = max([t.start + t.duration for t in ref + hyp], default=0.0)
    n = int(end / step) + 1

    def counts(turns):
        c = np.zeros(n, np.int16)
        for spk in {t.speaker for t in turns}:
            a = np.zeros(n, bool)
            for t in turns:
                if t.speaker == spk:
                    a[int(t.start / step) : int((t.start + t.duration) / step)] = True
            c += a
        return c

    r, h = counts(ref), counts(hyp)
    return float(((h >= 2) & (r >= 2)).sum()), float((h >= 2).sum())


def measure(segs: dict, refs: dict, cfg: PipelineConfig) -> dict:
    """DER at collars 0.25 and 0, its parts, speaker counts and overlap precision of one setting; under
    ``"_files"`` each file's (error, scored time) at collar 0.25, for ``share_better``."""
    hyp = {uri: stitch(s, cfg) for uri, s in segs.items()}
    per_file = {u: diarization_error_rate(refs[u], hyp.get(u, []), collar=0.25) for u in sorted(refs)}
    r = score(refs, hyp, collar=0.0)
    out = {"der_0.25": sum(per_file.values(), DERResult()).der, "der_0": r.der}
    out.update({k: getattr(r, k) / r.total for k in ("missed", "false_alarm", "confusion")})
    out["count_right"] = float(np.mean([speaker_count(hyp[u]) == speaker_count(refs[u]) for u in refs]))
    hit, called = map(sum, zip(*(overlap_precision(refs[u], hyp[u]) for u in refs)))
    out["overlap_precision"] = hit / called if called else None  # no overlap output: undefined (JSON null)
    out["overlap_called_s"] = called * 0.01
    out["_files"] = {u: (f.false_alarm + f.missed + f.confusion, f.total) for u, f in per_file.items()}
    return out


def share_better(a: dict, b: dict, *, resamples: int = 2000, seed: int = 0) -> float:
    """The share of paired bootstrap resamples of the files in which ``a``'s DER is below ``b``'s (``a``,
    ``b``: ``measure``'s ``"_files"`` of two settings on the same files); deterministic for a seed."""
    files = sorted(a)
    if sorted(b) != files:
        raise BadValue("share_better needs both settings scored on the same files")
    ea, ta, eb, tb = (np.array([d[u][i] for u in files]) for d in (a, b) for i in (0, 1))
    idx = np.random.default_rng(seed).integers(0, len(files), (resamples, len(files)))
    return float(np.mean(ea[idx].sum(1) / np.maximum(ta[idx].sum(1), 1e-9)
                         < eb[idx].sum(1) / np.maximum(tb[idx].sum(1), 1e-9)))


def _row(rows: list[dict], settings: dict, keys: tuple) -> dict | None:
    """The grid's row of ``settings`` (every key in ``keys``), or None where the grid does not hold them."""
    return next((r for r in rows if all(r[k] == settings[k] for k in keys)), None)


def keep_incumbent(rows: list[dict], best: dict, incumbent: dict, keys: tuple) -> dict:
    """Per mode with an incumbent in the grid: ``{"kept", "best_better_share", "settings"}``. The grid's best
    replaces the incumbent only where it is lower on dev in at least ``BEYOND_DOUBT`` of paired bootstrap
    resamples: a re-tuned model keeps settings that were chosen (and tested) before unless the dev set says
    otherwise beyond its noise. An incumbent that the grid does not hold cannot be compared: the best is taken."""
    out = {}
    for mode, kw in best.items():
        inc = incumbent.get(mode)
        if not inc:
            continue
        # a setting the incumbent does not name ran at the pipeline's default (a grid axis added since)
        settings = {k: inc.get(k, getattr(PipelineConfig, k, kw[k])) for k in keys}
        row = _row(rows, settings, keys)
        if row is None:
            out[mode] = {"kept": False, "in_grid": False, "best_better_share": None, "settings": settings}
            continue
        top = _row(rows, kw, keys)
        share = share_better(top["_files"], row["_files"]) if top is not row else 0.0
        out[mode] = {"kept": share < BEYOND_DOUBT, "in_grid": True, "best_better_share": share,
                     "settings": settings}
    return out


def _public(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("_")}


_WORKER: dict = {}


def _init(model, encoders) -> None:
    """A worker process: one thread each (the processes share the cores), the models loaded once."""
    exit_on_interrupt()
    torch.set_num_threads(1)
    _WORKER.update(model=model, encoders=encoders)


def _encoder(encoders: dict, cfg: PipelineConfig):
    if cfg.speaker_encoder not in encoders:
        raise BadValue(f"speaker_encoder {cfg.speaker_encoder!r}: not among the encoders given ({sorted(encoders)})")
    return encoders[cfg.speaker_encoder]


def _segment_one(job):
    path, cfg = job
    with torch.no_grad():
        uri = recording_uri(path)
        return uri, segment(_WORKER["model"], _encoder(_WORKER["encoders"], cfg), read_mono(path, SAMPLE_RATE), uri,
                            cfg)


def _by_name(encoder) -> dict:
    """``{name: encoder}`` of one encoder module or a dict of them."""
    return dict(encoder) if isinstance(encoder, dict) else {getattr(encoder, "name", "ge2e"): encoder}


class Segmenter:
    """Segments files with one model and its speaker encoders (one module, or ``{name: module}``: each
    setting's ``speaker_encoder`` picks one), in ``jobs`` processes (each loads them once); with one job in
    this process, leaving its thread count and grad mode as they were."""

    def __init__(self, model, encoder, jobs: int = 1, cache: str | pathlib.Path | None = None):
        encoders = _by_name(encoder)
        self.pool = ProcessPoolExecutor(jobs, initializer=_init, initargs=(model, encoders)) if jobs > 1 else None
        self.models = (model, encoders)
        #: the segmentations made so far, on disk (``segment_cache``): a stopped run resumes from them
        self.cache = SegmentCache(cache, model, encoders) if cache is not None else None

    def __call__(self, paths: list[pathlib.Path], cfg: PipelineConfig) -> dict:
        found = {p: self.cache.get(p, cfg) for p in paths} if self.cache else {}
        todo = [p for p in paths if found.get(p) is None]
        if self.pool:
            made = ((p, seg) for p, (_, seg) in zip(todo, self.pool.map(_segment_one, [(p, cfg) for p in todo])))
        else:
            model, encoders = self.models

            def one(p):
                with torch.no_grad():
                    return segment(model, _encoder(encoders, cfg), read_mono(p, SAMPLE_RATE), recording_uri(p), cfg)

            made = ((p, one(p)) for p in todo)
        for p, seg in made:  # each kept as it is made
            found[p] = seg
            if self.cache:
                self.cache.put(p, cfg, seg)
        return {recording_uri(p): found[p] for p in paths}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def _settings(grid: dict) -> list[dict]:
    return [dict(zip(grid, v)) for v in itertools.product(*grid.values())]


def _whitened(model, run, dev_files: list, modes: dict, segment_grid: dict, progress=None) -> dict:
    """Each mode's best ``WHITENED_GRID`` setting with whitened embeddings, on its chosen segmentation."""
    refs = {recording_uri(w): ref for w, ref in dev_files}
    out = {}
    for mode, kw in modes.items():
        segs = run([w for w, _ in dev_files], PipelineConfig.for_model(model, **{k: kw[k] for k in segment_grid}))
        best = None
        for st_kw in _settings(WHITENED_GRID):
            setting = {**kw, **st_kw, "whiten": True, "clustering": "ahc"}
            der = measure(segs, refs, PipelineConfig.for_model(model, **setting))["der_0.25"]
            if progress:
                progress({**setting, "der_0.25": der})
            if best is None or der < best[0]:
                best = (der, setting)
        out[mode] = best[1]
    return out


def _clustering(cfg: PipelineConfig) -> dict:
    """How a row's embeddings were clustered, whether or not the grid has these axes."""
    return {"whiten": cfg.whiten, "clustering": cfg.clustering, **{k: getattr(cfg, k) for k in VBX_KEYS}}


def _keys(segment_grid: dict, stitch_grid: dict) -> tuple:
    """The settings that name a row: the grids' axes and how the embeddings were clustered."""
    return tuple(dict.fromkeys((*segment_grid, *stitch_grid, "whiten", "clustering", *VBX_KEYS)))


def _vbx(model, run, dev_files: list, modes: dict, rows: list, segment_grid: dict, stitch_grid: dict,
         progress=None) -> dict:
    """Each mode's best ``VBX_GRID`` setting on its chosen segmentation (rows appended to ``rows``):
    ``{mode: settings}``."""
    refs = {recording_uri(w): ref for w, ref in dev_files}
    keys = _keys(segment_grid, stitch_grid)
    out = {}
    for mode, kw in modes.items():
        segs = run([w for w, _ in dev_files], PipelineConfig.for_model(model, **{k: kw[k] for k in segment_grid}))
        best = None
        for st_kw in _settings(VBX_GRID):
            setting = {**kw, **st_kw, "clustering": "vbx", "whiten": False}
            row = {**setting, **measure(segs, refs, PipelineConfig.for_model(model, **setting))}
            rows.append(row)
            if progress:
                progress(_public(row))
            if best is None or row["der_0.25"] < best["der_0.25"]:
                best = row
        out[mode] = {k: best[k] for k in keys}
    return out


def _other_encoders(model, run, dev_files: list, modes: dict, rows: list, keys: tuple, names: list[str],
                    progress=None) -> tuple[dict, dict]:
    """Each other encoder's ``ENCODER_GRID`` settings on each mode's chosen segmentation settings (rows
    appended to ``rows``): ``({name: {mode: chosen}}, {name: {mode: best}})``: the best is the lowest dev DER
    (what says whether the encoder is better), the chosen the lowest cut within ``ENCODER_TIE`` of it."""
    refs = {recording_uri(w): ref for w, ref in dev_files}
    out, bests = {}, {}
    for name in names:
        grid = ENCODER_GRID.get(name, {"piece": (1.5,), "cluster_threshold": STITCH_GRID["cluster_threshold"],
                                       "min_cluster": (4.0, 8.0)})
        out[name], bests[name] = {}, {}
        for mode, kw in modes.items():
            best, tried = None, []
            for piece in grid["piece"]:
                seg_kw = {**kw, "speaker_encoder": name, "piece": piece}
                if name != "ge2e":  # the model file's whitening and PLDA model read GE2E embeddings only
                    seg_kw.update(whiten=False, clustering="ahc")
                segs = run([w for w, _ in dev_files], PipelineConfig.for_model(model, **seg_kw))
                for cut, floor in itertools.product(grid["cluster_threshold"], grid["min_cluster"]):
                    setting = {**seg_kw, "cluster_threshold": cut, "min_cluster": floor}
                    row = {**setting, **measure(segs, refs, PipelineConfig.for_model(model, **setting))}
                    rows.append(row)
                    tried.append(row)
                    if progress:
                        progress(_public(row))
                    if best is None or row["der_0.25"] < best["der_0.25"]:
                        best = row
            tied = [r for r in tried if r["der_0.25"] <= best["der_0.25"] + ENCODER_TIE]
            chosen = min(tied, key=lambda r: (r["cluster_threshold"], r["der_0.25"]))
            out[name][mode], bests[name][mode] = ({k: r[k] for k in keys} for r in (chosen, best))
    return out, bests


def tune_pipeline(model, encoder, dev: list, tests: dict | None = None, *, segment_grid: dict = SEGMENT_GRID,
                  stitch_grid: dict = STITCH_GRID, jobs: int = 1,
                  progress: Callable[[dict, float], None] | None = None, incumbent: dict | None = None,
                  cache: str | pathlib.Path | None = None) -> dict:
    """Every setting of the grids on the ``dev`` folders together; ``tests`` (name -> folders) scored once.

    Returns the rows, the dev choice per mode (``modes``), the default mode
    (``speakers``), the best ``vad="speech"`` reading and, per test set, the
    choice's and that reading's scores. ``incumbent`` (mode -> settings, a model
    file's stored choice): a mode keeps its incumbent unless the grid's best is
    lower beyond doubt (``keep_incumbent``). ``encoder``: one speaker encoder, or ``{name: encoder}``: the first
    is the grid's; each other is tried on each mode's choice (``ENCODER_GRID``), its best stored under
    ``encoders`` and made the mode's choice where lower beyond doubt. ``cache``: a folder where each
    segmentation is kept as it is made (:mod:`.segment_cache`), so that a stopped run resumes; the caller
    removes it once the result is kept.
    """
    encoders = _by_name(encoder)
    first = next(iter(encoders))
    segment_grid = {**segment_grid, "speaker_encoder": segment_grid.get("speaker_encoder", (first,))}
    if getattr(model, "whitening", None) is None:  # nothing to whiten with
        stitch_grid = {**stitch_grid, "whiten": tuple(v for v in stitch_grid.get("whiten", (False,)) if not v)}
        if not stitch_grid["whiten"]:
            raise BadValue("the grid asks for whiten=true only, but the model file holds no embedding whitening")
    if (getattr(model, "whitening", None) or {}).get("plda") is None:  # no PLDA model to cluster with
        stitch_grid = {**stitch_grid, "clustering": tuple(v for v in stitch_grid.get("clustering", ("ahc",))
                                                          if v != "vbx")}
        if not stitch_grid["clustering"]:
            raise BadValue("the grid asks for clustering=vbx only, but the model file holds no PLDA model")
    by_folder: dict = {}  # each folder's recordings, read once (a folder named twice counts once, as files_of)
    for d in dev:
        files = files_of([d])
        by_folder.setdefault(pathlib.Path(d).resolve(), (d, files))
    dev_files = unique_recordings([f for _, files in by_folder.values() for f in files], "--dev")
    if not dev_files:
        raise NotFound(f"no dev recordings with references in {[str(d) for d in dev]}")
    for d, files in by_folder.values():  # a folder of sounds alone, or of other recordings' references: said
        if len(dev) > 1 and not _has_speech(files):
            warnings.warn(f"--dev {d}: no recording with reference speech (each wav named in its folder's ref.rttm"
                          "): it adds nothing to the dev set", stacklevel=2)
    # the test sets are read before any work: one without speech to score failed after the whole grid had run
    test_sets = {name: _scorable(unique_recordings(files_of(dirs), f"test set {name}"), f"test set {name}", dirs)
                 for name, dirs in (tests or {}).items()}
    held = {pathlib.Path(d).resolve() for dirs in (tests or {}).values() for d in dirs}
    same = sorted({pathlib.Path(d).resolve() for d in dev} & held)
    if same:  # a test set the settings were chosen on is no test
        raise BadValue(f"{same[0]} is both a dev and a test folder: a test set must be held out from the dev set "
                       "the settings are chosen on")
    refs = {recording_uri(w): ref for w, ref in dev_files}
    run = Segmenter(model, encoders, jobs, cache)
    rows, t0 = [], time.time()
    shown = (lambda row: progress(row, time.time() - t0)) if progress else None  # noqa: E731
    try:
        for seg_kw in _settings(segment_grid):
            if not meaningful(seg_kw, stitch_grid):
                continue
            segs = run([w for w, _ in dev_files], PipelineConfig.for_model(model, **seg_kw))
            for st_kw in _settings(stitch_grid):
                if not meaningful({**seg_kw, **st_kw}, stitch_grid):
                    continue
                cfg = PipelineConfig.for_model(model, **seg_kw, **st_kw)
                rows.append({**_clustering(cfg), **seg_kw, **st_kw, **measure(segs, refs, cfg)})
                if shown:
                    shown(_public(rows[-1]))
        keys = _keys(segment_grid, stitch_grid)
        pick = lambda rs: {k: min(rs, key=lambda r: r["der_0.25"])[k] for k in keys}  # noqa: E731
        modes = {m: pick(rs) for m in ("eend", "speech") if (rs := [r for r in rows if r["speakers"] == m
                                                                       and r["vad"] != "speech"])}
        if not modes:
            raise BadValue("the grid has no setting where the model decides speech (vad off, gate, union or veto)")
        # each mode's best with the whitened embeddings, where the grid tried them: what --whiten then uses
        whitened = {m: pick(rs) for m in ("eend", "speech") if (rs := [r for r in rows if r["speakers"] == m
                                                                          and r["vad"] != "speech" and r["whiten"]])}
        incumbent = {m: {"speaker_encoder": "ge2e", **kw} for m, kw in (incumbent or {}).items()}
        kept = keep_incumbent(rows, modes, incumbent, keys)
        modes = {m: kept[m]["settings"] if m in kept and kept[m]["kept"] else kw for m, kw in modes.items()}
        if not whitened and getattr(model, "whitening", None) is not None:
            whitened = _whitened(model, run, dev_files, modes, segment_grid, shown)
        # VBx: each mode's best where the grid tried it (what --clustering vbx uses), else its best on each mode's
        # chosen segmentation; and where the grid chose VBx, the tree's own best (what --clustering ahc uses)
        by = lambda m, how: [r for r in rows if r["speakers"] == m and r["vad"] != "speech"  # noqa: E731
                             and r["clustering"] == how and not r["whiten"]]
        vbx = {m: pick(rs) for m in modes if (rs := by(m, "vbx"))}
        if not vbx and (getattr(model, "whitening", None) or {}).get("plda") is not None:
            vbx = _vbx(model, run, dev_files, modes, rows, segment_grid, stitch_grid, shown)
        ahc = {m: pick(by(m, "ahc")) for m, kw in modes.items() if kw["clustering"] == "vbx" and by(m, "ahc")}
        # other speaker encoders, each on each mode's choice; one replaces it where lower beyond doubt
        others = [n for n in encoders if n not in segment_grid["speaker_encoder"]]
        by_encoder, best_of = (_other_encoders(model, run, dev_files, modes, rows, keys, others, shown) if others
                               else ({}, {}))
        encoder_share = {}  # how sure the dev set is that the encoder's best is lower than the mode's choice
        for name, per_mode in best_of.items():
            for m, kw in per_mode.items():
                encoder_share.setdefault(name, {})[m] = share_better(_row(rows, kw, keys)["_files"],
                                                                     _row(rows, modes[m], keys)["_files"])
        if by_encoder:
            by_encoder = {first: dict(modes), **by_encoder}  # what --speaker-encoder NAME uses, for every encoder
        for name, shares in encoder_share.items():
            modes = {m: by_encoder[name][m] if shares.get(m, 0.0) >= BEYOND_DOUBT else kw for m, kw in modes.items()}
        # an incumbent with another encoder than the grid's (CAM++'s choice, as shipped) is no row of the grid:
        # it is measured now and kept unless the final choice is lower beyond doubt
        for m, inc in incumbent.items():
            enc = inc.get("speaker_encoder")
            if m not in modes or kept.get(m, {}).get("in_grid") or enc not in others:
                continue
            settings = {k: inc.get(k, getattr(PipelineConfig, k, modes[m][k])) for k in keys}
            row = _row(rows, settings, keys)
            if row is None:
                cfg = PipelineConfig.for_model(model, **settings)
                row = {**settings, **measure(run([w for w, _ in dev_files], cfg), refs, cfg)}
                rows.append(row)
                if shown:
                    shown(_public(row))
            top = _row(rows, modes[m], keys)
            share = share_better(top["_files"], row["_files"]) if row is not top else 0.0
            kept[m] = {"kept": share < BEYOND_DOUBT, "in_grid": False, "measured": True,
                       "best_better_share": share, "settings": settings}
            if kept[m]["kept"]:
                modes[m] = settings
        chosen = {m: _row(rows, kw, keys) for m, kw in modes.items()}
        vbx_share = {m: share_better(_row(rows, kw, keys)["_files"], chosen[m]["_files"]) for m, kw in vbx.items()
                     if kw != modes[m]}  # how sure the dev set is that VBx is lower than the choice
        other = next(m for m in ("speech", "eend") if m != PREFERRED_MODE)
        share = (share_better(chosen[other]["_files"], chosen[PREFERRED_MODE]["_files"]) if len(modes) == 2
                 else None)
        speakers = next(iter(modes)) if share is None else other if share >= BEYOND_DOUBT else PREFERRED_MODE
        vad_rows = [r for r in rows if r["vad"] == "speech"]
        readings = {"chosen": modes[speakers]}
        if vad_rows:
            readings["vad_speech"] = pick(vad_rows)
        result = {"dev": [str(d) for d in dev], "dev_files": len(dev_files), "grid": [_public(r) for r in rows],
                  "modes": modes, "speakers": speakers, "readings": readings, "whitened": whitened, "vbx": vbx,
                  "ahc": ahc, "vbx_better_share": vbx_share, "encoders": by_encoder,
                  "encoder_better_share": encoder_share,
                  "mode_choice": {"preferred": PREFERRED_MODE, "other": other, "other_better_share": share,
                                  "beyond_doubt": BEYOND_DOUBT},
                  "incumbent": {m: {k: v for k, v in kept[m].items() if k != "settings"} for m in kept},
                  "dev_scores": {name: _public(_row(rows, kw, keys))
                                 for name, kw in readings.items()}}
        for name, files in test_sets.items():  # scored once per reading, with the dev choice
            test_refs = {recording_uri(w): ref for w, ref in files}
            result[f"test:{name}"] = {}
            for reading, kw in readings.items():
                cfg = PipelineConfig.for_model(model, **kw)
                result[f"test:{name}"][reading] = _public(measure(run([w for w, _ in files], cfg), test_refs, cfg))
    finally:
        run.close()
    return result
