"""Clustering and stitching: local speakers of every window to global speakers, then turns."""
from __future__ import annotations

import math

import torch

from ..io.features import FeatureConfig
from ..io.rttm import Turn
from . import vbx, whiten
from .cluster import check_speaker_counts, cluster
from .config import PipelineConfig
from .postprocess import fill_gaps, hold, median_filter, to_turns
from .segment import Segmentation, segment


def local_count(local: torch.Tensor, cfg: PipelineConfig) -> torch.Tensor:
    """Speakers talking in each frame of one window ``(size, K)`` (local speakers merged by cluster): the
    likeliest counts above ``cfg.threshold``, each further one above ``cfg.overlap_threshold``."""
    top = local.sort(dim=1, descending=True).values
    over = cfg.threshold if cfg.overlap_threshold is None else cfg.overlap_threshold
    return (top[:, :1] > cfg.threshold).float() + (top[:, 1:] > over).sum(1, keepdim=True)


def cluster_floor(seg: Segmentation, cfg: PipelineConfig, lo: int = 1) -> float:
    """The least speech (s) a cluster needs to stay a speaker: ``cfg.min_cluster`` seconds, or
    ``cfg.min_cluster_share`` of all the recording's embedded speech where that is more. With at least ``lo`` > 1
    speakers asked for, the seconds alone: a minor speaker under the share would make the tree split a large
    voice to give the count, then fold the minor one into it."""
    share = cfg.min_cluster_share if lo <= 1 else 0.0
    return max(cfg.min_cluster, share * float(seg.weights.sum()))


def stitch(seg: Segmentation, cfg: PipelineConfig, *, num_speakers: int | None = None,
           min_speakers: int | None = None, max_speakers: int | None = None) -> list[Turn]:
    """Cluster the embeddings, map local speakers to global ones, average over windows, threshold: turns."""
    lo, _ = check_speaker_counts(num_speakers, min_speakers, max_speakers)
    if not seg.pieces:
        return []
    counts = {"num_speakers": num_speakers, "min_speakers": min_speakers, "max_speakers": max_speakers}
    floor = cluster_floor(seg, cfg, lo)
    if cfg.clustering == "vbx":
        labels = vbx.cluster_vbx(seg.embeddings.numpy(), seg.plda, threshold=cfg.cluster_threshold, fa=cfg.vbx_fa,
                                 fb=cfg.vbx_fb, dims=cfg.vbx_dims, weights=seg.weights, min_weight=floor, **counts)
    else:
        emb = whiten.apply(seg.embeddings, seg.whitening) if cfg.whiten else seg.embeddings
        labels = cluster(emb.numpy(), threshold=cfg.cluster_threshold, weights=seg.weights,
                         min_weight=floor, merge=cfg.merge_threshold, reassign=cfg.reassign,
                         **counts)
    # at most one speaker per embedding (the clustering's own bound): a count of a million asked for a million
    # columns per frame
    k_total = max(int(labels.max()) + 1, min(lo, len(seg.weights)))
    size = seg.probs.shape[1]
    total = torch.zeros(seg.frames, k_total)
    count = torch.zeros(seg.frames, 1)
    speakers = torch.zeros(seg.frames, 1)  # sum over windows of the local speaker count
    # a window's frames near its edges saw little context: with "hamming" they count less (never zero)
    wgt = (torch.hamming_window(size, periodic=False) if cfg.weighting == "hamming" and size > 2
           else torch.ones(size)).clamp_min(1e-3)[:, None]  # size, 1
    by_window: dict[int, list] = {}
    for w, s, a, b, row in seg.pieces:
        by_window.setdefault(w, []).append((s, a, b, int(labels[row])))
    for w, s0 in enumerate(seg.starts):
        local = torch.zeros(size, k_total)
        for s, a, b, k in by_window.get(w, []):  # local speakers sharing a cluster merge by maximum
            local[a:b, k] = torch.maximum(local[a:b, k], seg.probs[w, a:b, s])
        n = min(size, seg.frames - s0)
        total[s0 : s0 + n] += (local * wgt)[:n]
        count[s0 : s0 + n] += wgt[:n]
        speakers[s0 : s0 + n] += (local_count(local, cfg) * wgt)[:n]
    covered = count.clamp_min(1e-9)  # frames no window covers have zero totals
    glob = total / covered  # weighted average over the windows covering each frame
    # how many speakers talk in each frame: the windows' mean count; then that many global speakers, the likeliest
    n_active = (speakers / covered + 0.5).floor().clamp(max=k_total).long().squeeze(1)  # T
    rank = glob.argsort(dim=1, descending=True).argsort(dim=1)  # T, K: 0 for the likeliest
    active = ((rank < n_active[:, None]) & (glob > 0)).to(torch.uint8)
    active = median_filter(active, cfg.median)
    if cfg.offset_threshold < 1:  # turns held on through silent frames while still likely (hysteresis), the
        active = median_filter(hold(active, glob, cfg.offset_threshold), cfg.median)  # seams it makes smoothed too
    # every pause shorter than fill_gap seconds: round() left 0.15 s (1.4999... frames) and 0.25 s (2, to even)
    active = fill_gaps(active, math.ceil(cfg.fill_gap / seg.frame_seconds - 1e-9), exclusive=cfg.speakers == "speech")
    # labelled by decreasing speech in what is written (the clusters came ordered by their embeddings' weight,
    # which caps each piece's seconds)
    active = active[:, torch.argsort(active.sum(0, dtype=torch.int64), descending=True, stable=True)]
    turns = to_turns(active.float(), seg.frame_seconds, seg.uri, threshold=0.5, median=1,
                     labels=[f"spk{k}" for k in range(k_total)])
    return turns if seg.duration is None else within(turns, seg.duration)


def within(turns: list[Turn], duration: float) -> list[Turn]:
    """``turns`` inside ``[0, duration]``: the frames are 100 ms, and the last one may reach past the audio's
    end, which no turn does (tuning scored that tail as false alarm where ``diarize`` had cut it)."""
    return [t if t.end <= duration else ending_at(t, duration) for t in turns if t.start < duration]


def ending_at(t: Turn, end: float) -> Turn:
    """``t`` cut to end at ``end`` (``start + duration <= end`` in floating point too)."""
    duration = end - t.start
    while t.start + duration > end:
        duration = math.nextafter(duration, 0.0)
    return Turn(t.uri, t.start, duration, t.speaker)


def diarize_waveform(model, encoder, wave16k: torch.Tensor, uri: str, cfg: PipelineConfig, *,
                     num_speakers: int | None = None, min_speakers: int | None = None,
                     max_speakers: int | None = None, feature_cfg: FeatureConfig = FeatureConfig()) -> list[Turn]:
    """Speaker turns of one mono 16 kHz recording (labels ``spk0``, ``spk1``... by decreasing speech)."""
    check_speaker_counts(num_speakers, min_speakers, max_speakers)
    seg = segment(model, encoder, wave16k, uri, cfg, feature_cfg)
    return stitch(seg, cfg, num_speakers=num_speakers, min_speakers=min_speakers, max_speakers=max_speakers)
