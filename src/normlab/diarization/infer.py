"""Inference: audio file -> features -> model -> frame probabilities -> speaker turns -> RTTM.

Long recordings are processed in chunks of ``chunk_frames`` output frames
that overlap by ``overlap_frames``; EEND's speaker order is arbitrary per
chunk, so each chunk's speaker columns are permuted to agree best with the
previous chunk on the overlap before the chunks are joined.
"""
from __future__ import annotations

import pathlib

import torch

from .._checks import BadValue
from .features import FeatureConfig, extract, load_audio
from .model import EENDModel
from .permutation import align
from .postprocess import to_turns
from .rttm import Turn, write_rttm


@torch.no_grad()
def frame_probs(model: EENDModel, feats: torch.Tensor, chunk_frames: int = 1500, overlap_frames: int = 100) -> torch.Tensor:
    """Speaker probabilities ``(frames, speakers)`` for features ``(frames, dim)``."""
    if overlap_frames >= chunk_frames:
        raise BadValue(f"overlap_frames ({overlap_frames}) must be smaller than chunk_frames ({chunk_frames})")
    model.eval()
    n = feats.shape[0]
    s = model.cfg.n_speakers
    if n == 0:
        return torch.zeros(0, s)
    device = next(model.parameters()).device  # inference follows the model's device; probabilities on the CPU
    out = torch.sigmoid(model(feats[None, :chunk_frames].to(device)))[0].cpu()  # T0, S
    start = chunk_frames - overlap_frames
    while out.shape[0] < n:
        p = torch.sigmoid(model(feats[None, start : start + chunk_frames].to(device)))[0].cpu()  # Tc, S
        ov = out.shape[0] - start  # frames shared with what is already decided
        p = align(out, p, ov)  # this chunk in the speaker order of what is decided
        out = torch.cat([out[:start], (out[start:] + p[:ov]) / 2, p[ov:]])
        start += chunk_frames - overlap_frames
    return out[:n]


def diarize_file(model: EENDModel, path: str | pathlib.Path, cfg: FeatureConfig = FeatureConfig(), *,
                 threshold: float | None = None, median: int | None = None, chunk_frames: int = 1500) -> list[Turn]:
    """Speaker turns of one recording with the model's own speakers only (at most ``n_speakers``; no clustering).

    The uri is the file's stem; ``threshold`` and ``median`` default to the
    model file's (as ``normlab.diarization.diarize``). The full pipeline, for
    any number of speakers, is ``normlab.diarization.diarize``.
    """
    path = pathlib.Path(path)
    threshold = model.postprocess["threshold"] if threshold is None else threshold
    median = model.postprocess["median"] if median is None else median
    feats = extract(load_audio(path, cfg.sample_rate), cfg)  # T, D
    probs = frame_probs(model, feats, chunk_frames)
    return to_turns(probs, cfg.frame_seconds, path.stem, threshold=threshold, median=median)


def diarize_files(model: EENDModel, paths: list[str], out_dir: str | pathlib.Path, **kw) -> dict[str, str]:
    """Write ``out_dir/<stem>.rttm`` per file; returns ``{path: "ok" | error message}`` (one bad file never stops the rest)."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    status = {}
    for p in paths:
        try:
            turns = diarize_file(model, p, **kw)
            write_rttm(turns, out_dir / f"{pathlib.Path(p).stem}.rttm")
            status[p] = "ok"
        except ValueError as e:  # AudioError and friends: reported per file
            status[p] = str(e)
    return status
