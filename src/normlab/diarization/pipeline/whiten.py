"""Whitening of the speaker embeddings, learned on training conversations (within-class covariance
normalization, WCCN).

The speaker encoder was trained elsewhere; on this model's pieces (1.5 s of
one local speaker) one person's embeddings scatter along a few directions
(what is said, the room, the level) as far as two persons' differ. Within a
training conversation the pieces of one speaker give that scatter: ``S_w``,
the mean within-speaker covariance, scaled to unit mean variance. The
embeddings are mapped by ``(S_w + lam I)^(-1/2)`` before the cosine
clustering: directions where one speaker wanders count less, the others
more; ``lam`` shrinks the map towards the identity (``lam`` large: the
embeddings unchanged up to scale). The map is a property of the model and
encoder pair, fitted once (``normlab diarize whiten``; the recipe's last
stage but one) and stored in the model file; ``PipelineConfig.whiten``
turns it on, chosen with the clustering cut on the dev set.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._checks import BadValue
from ..io.rttm import Turn
from .segment import Segmentation

#: the share of a piece's active frames that must be one reference speaker alone for it to teach the map
PURE = 0.9


def piece_speakers(seg: Segmentation, ref: list[Turn], threshold: float) -> dict[int, str]:
    """Embedding row -> reference speaker, for the rows whose pieces are one speaker: of each piece's frames
    above ``threshold``, at least :data:`PURE` hold exactly one reference speaker, and the same one (rows
    shared by pieces that disagree are left out)."""
    speakers = sorted({t.speaker for t in ref})
    found: dict[int, set] = {}
    for w, s, a, b, row in seg.pieces:
        on = (seg.probs[w, a:b, s] > threshold).nonzero().squeeze(1).numpy()
        if on.size == 0:
            continue
        t = (seg.starts[w] + a + on + 0.5) * seg.frame_seconds
        talk = np.zeros((on.size, len(speakers)), bool)
        for turn in ref:
            talk[:, speakers.index(turn.speaker)] |= (t >= turn.start) & (t < turn.start + turn.duration)
        votes = talk[talk.sum(1) == 1].sum(0)
        if votes.size and votes.max() >= PURE * on.size:
            found.setdefault(row, set()).add(speakers[int(votes.argmax())])
    return {row: next(iter(s)) for row, s in found.items() if len(s) == 1}


def check_lam(lam: float) -> None:
    """BadValue unless ``lam`` (the ridge added to the within-speaker scatter) is a finite number > 0."""
    if not 0 < lam < float("inf"):
        raise BadValue(f"whitening lam must be a finite number > 0, got {lam}")


def check_spread(within: np.ndarray, what: str) -> None:
    """BadValue unless the within-speaker scatter ``within`` has some spread (a positive trace): the fits below
    scale by it (0/0, or an eigensolver refusing a zero matrix)."""
    if not np.trace(within) > 0:
        raise BadValue("each speaker's pieces have the same embedding in these recordings: no within-speaker "
                       f"spread to fit {what} on")


def fit(segmentations: list[tuple[Segmentation, list[Turn]]], threshold: float, lam: float = 1.0) -> dict:
    """The whitening map ``(dim, dim)`` from training recordings and their references, with what it was fitted
    on: ``{"matrix", "lam", "recordings", "pieces", "speakers"}``."""
    check_lam(lam)
    dim = next((s.embeddings.shape[1] for s, _ in segmentations if s.embeddings.numel()), None)
    scatter, pieces, classes = None, 0, 0
    for seg, ref in segmentations:
        rows = piece_speakers(seg, ref, threshold)
        emb = seg.embeddings.double().numpy()
        for spk in set(rows.values()):
            x = emb[[r for r, s in rows.items() if s == spk]]
            if len(x) < 2:
                continue
            x = x - x.mean(0)
            scatter = x.T @ x if scatter is None else scatter + x.T @ x
            pieces, classes = pieces + len(x), classes + 1
    if scatter is None:
        raise BadValue("no speaker has two pieces of one voice in these recordings: nothing to fit the whitening on")
    sw = scatter / pieces
    check_spread(sw, "the whitening")
    sw = sw / (np.trace(sw) / dim)  # unit mean variance: lam is relative to it
    vals, vecs = np.linalg.eigh(sw + lam * np.eye(dim))
    matrix = (vecs * vals ** -0.5) @ vecs.T
    return {"matrix": torch.from_numpy(matrix).float(), "lam": float(lam), "recordings": len(segmentations),
            "pieces": pieces, "speakers": classes}


def tensor_problem(value, name: str, ndim: int) -> str | None:
    """What keeps ``value`` (a model file's field ``name``) from being a finite floating-point tensor of ``ndim``
    dimensions, none empty, as the end of a sentence ("its ..."); None if nothing does."""
    if value is None:
        return f"{name} is missing"
    if not isinstance(value, torch.Tensor):
        return f"{name} is not a tensor ({type(value).__name__})"
    if not value.is_floating_point():
        return f"{name} holds {str(value.dtype).removeprefix('torch.')} values, not floating-point numbers"
    if value.dim() != ndim or not value.numel():
        return f"{name} is {tuple(value.shape)}, not a {'vector' if ndim == 1 else 'matrix'}"
    if not bool(value.isfinite().all()):
        return f"{name} holds NaN or infinite values"
    return None


def stored_problem(fitted: dict) -> str | None:
    """What is wrong with a model file's whitening entry (what :func:`fit_files` stored), as the end of a sentence
    ("its ..."); None if nothing. Checked when the file is loaded, as its weights are: a damaged entry read at
    clustering time failed with a traceback, or as "embeddings hold NaN". Of the entry the pipeline reads the
    matrix and the PLDA model (:func:`normlab.diarization.pipeline.vbx.stored_problem`), each optional; the
    rest records what the fit was made on."""
    from .vbx import stored_problem as plda_problem

    matrix, plda = fitted.get("matrix"), fitted.get("plda")
    if matrix is not None:
        problem = tensor_problem(matrix, "whitening matrix", 2)
        if problem is None and matrix.shape[0] != matrix.shape[1]:
            problem = f"whitening matrix is {tuple(matrix.shape)}, not square"
        if problem:
            return problem
    if plda is not None:
        problem = plda_problem(plda)
        if problem:
            return problem
        if matrix is not None and matrix.shape[0] != plda["mean"].shape[0]:  # both read one encoder's embeddings
            return (f"whitening matrix is for {matrix.shape[0]}-dimensional embeddings, its PLDA model for "
                    f"{plda['mean'].shape[0]}")
    return None


def apply(embeddings: torch.Tensor, matrix: torch.Tensor | None) -> torch.Tensor:
    """``embeddings (n, dim)`` mapped by ``matrix`` and L2-normalized again (the clustering's cosines)."""
    if matrix is None:
        raise BadValue("whiten is on but the model file holds no embedding whitening (fit one: normlab diarize "
                       "whiten MODEL --train DIR)")
    if matrix.shape != (embeddings.shape[1],) * 2:
        raise BadValue(f"the model file's whitening is {tuple(matrix.shape)}, the embeddings have "
                       f"{embeddings.shape[1]} dimensions: fitted with another speaker encoder")
    x = embeddings.double() @ matrix.double()
    return (x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)).float()


#: seconds per piece of a fit where the model file holds no settings chosen with GE2E (the shipped whitening's)
FIT_PIECE = 1.5


def fit_files(model, encoder, dirs: list, *, lam: float = 1.0, per_folder: int | None = None, jobs: int = 1,
              progress=None) -> dict:
    """:func:`fit` on the recordings of ``dirs`` (``wav/*.wav`` and ``ref.rttm``; at most ``per_folder`` of
    each, by name), segmented with the model's own ``eend`` settings, and under ``"plda"`` the PLDA model
    :func:`normlab.diarization.pipeline.vbx.fit` of the same pieces; records the folders."""
    import pathlib

    from ..io.audio import recording_uri
    from . import vbx
    from .config import PipelineConfig
    from .tuning import Segmenter, files_of, unique_recordings

    check_lam(lam)  # before the recordings are segmented (minutes), not after
    dirs = list({pathlib.Path(d).resolve(): d for d in dirs}.values())  # a folder named twice counts once
    by_folder = {d: files_of([d])[:per_folder] for d in dirs}
    files = unique_recordings([f for found in by_folder.values() for f in found], "--train")
    if not files:
        raise BadValue(f"no recordings with references in {[str(d) for d in dirs]}")
    # the whitening and the PLDA model are GE2E's: its pieces, with the settings chosen with GE2E where the file
    # has them (a model whose mode chose CAM++ keeps GE2E's beside it); where none were, GE2E pieces of
    # FIT_PIECE seconds (the fit reads no cluster cut: any does)
    try:
        cfg = PipelineConfig.for_model(model, speakers="eend", whiten=False, speaker_encoder="ge2e")
    except BadValue:
        cfg = PipelineConfig.for_model(model, speakers="eend", whiten=False, speaker_encoder="ge2e",
                                       clustering="ahc", cluster_threshold=0.35, piece=FIT_PIECE)
    run = Segmenter(model, encoder, jobs)
    try:
        segs = []
        for i in range(0, len(files), 50):  # in blocks: a long fit shows its progress
            part = files[i : i + 50]
            found = run([w for w, _ in part], cfg)
            segs += [(found[recording_uri(w)], ref) for w, ref in part]
            if progress:
                progress(len(segs) - 1, len(files), "segment")  # counted from 0, as every progress callback
    finally:
        run.close()
    fitted = fit(segs, cfg.threshold, lam)
    try:  # the PLDA model VBx clusters with (pipeline/vbx.py), from the same pieces
        fitted["plda"] = vbx.fit(segs, cfg.threshold)
    except BadValue:  # one speaker with two pieces whitens, but gives no between-speaker covariance
        pass
    fitted["folders"] = {pathlib.Path(d).name: len(found) for d, found in by_folder.items()}
    return fitted
