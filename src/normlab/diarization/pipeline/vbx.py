"""Bayesian clustering of the speaker embeddings: a PLDA model and VBx's variational Bayes (without its HMM).

VBx (Diez et al. 2019; Landini et al. 2022, "Bayesian HMM clustering of
x-vector sequences") explains the embeddings of a recording as a mixture of
speakers under a two-covariance PLDA model: in the PLDA space an embedding
is ``y = V z_s + e``, ``e ~ N(0, I)`` the within-speaker scatter, ``z_s ~
N(0, I)`` the speaker, ``V = diag(sqrt(phi))`` the between-speaker scale
per dimension. Variational Bayes alternates the speakers' posteriors given
the pieces' responsibilities and the responsibilities given the speakers;
a speaker whose prior weight ``pi`` falls to nothing leaves. Started from an
agglomerative clustering cut low (more clusters than speakers), it decides
the count from the likelihood of the pieces under the model, not from one
cosine cut. ``fa`` scales the pieces' likelihoods (they are not
independent: overlapping pieces of one window), ``fb`` the speakers' prior
(larger: fewer speakers). The pieces here are not a time sequence (a window's
local speakers overlap in time), so the HMM's speaker turns are left out, as
pyannote.audio does with its own embeddings.

The PLDA model is fitted, like the whitening, on pieces of one voice in
training conversations (:func:`normlab.diarization.pipeline.whiten.piece_speakers`),
each conversation's speakers distinct classes.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._checks import BadValue
from ..io.rttm import Turn
from .segment import Segmentation
from .whiten import check_spread, tensor_problem


def _norm(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def fit(segmentations: list[tuple[Segmentation, list[Turn]]], threshold: float) -> dict:
    """The PLDA model (:func:`fit_groups`) of the pieces of one voice in ``segmentations`` (recordings with
    their references; each recording's speakers are distinct classes)."""
    from .whiten import piece_speakers

    groups = []
    for seg, ref in segmentations:
        rows = piece_speakers(seg, ref, threshold)
        emb = seg.embeddings.double().numpy()
        for spk in set(rows.values()):
            groups.append(emb[[r for r, s in rows.items() if s == spk]])
    return fit_groups(groups)


def fit_groups(groups: list[np.ndarray]) -> dict:
    """The two-covariance PLDA model of embeddings grouped by speaker (``(pieces, dim)`` each; groups of one
    piece are left out): ``{"mean" (dim,), "transform" (dim, dim), "phi" (dim,), "pieces", "speakers"}``.
    ``transform`` maps centred, length-normalized embeddings (:func:`project`) to the space where the
    within-speaker covariance is the identity and the between-speaker covariance ``diag(phi)``, ``phi`` in
    decreasing order."""
    from scipy.linalg import eigh

    groups = [np.asarray(g, dtype=np.float64) for g in groups if len(g) >= 2]
    if len(groups) < 2:
        raise BadValue("fewer than two speakers with two pieces of one voice in these recordings: nothing to fit "
                       "the PLDA model on")
    mean = _norm(np.concatenate(groups)).mean(0)
    dim = mean.shape[0]
    groups = [_norm(_norm(g) - mean) * np.sqrt(dim) for g in groups]
    centre = np.concatenate(groups).mean(0)
    within, between, n = np.zeros((dim, dim)), np.zeros((dim, dim)), 0
    for g in groups:
        mu = g.mean(0)
        within += (g - mu).T @ (g - mu)
        between += len(g) * np.outer(mu - centre, mu - centre)
        n += len(g)
    within, between = within / n, between / n
    check_spread(within, "the PLDA model")  # (the ridge below is relative to it: eigh refused a zero matrix)
    # vecs.T @ within @ vecs = I, vecs.T @ between @ vecs = diag(phi); a small ridge keeps within invertible
    phi, vecs = eigh(between, within + 1e-6 * np.trace(within) / dim * np.eye(dim))
    order = np.argsort(phi)[::-1]
    return {"mean": torch.from_numpy(mean).float(), "transform": torch.from_numpy(vecs[:, order]).float(),
            "phi": torch.from_numpy(np.maximum(phi[order], 1e-9)).float(), "pieces": n, "speakers": len(groups)}


def stored_problem(plda) -> str | None:
    """What is wrong with a model file's PLDA model (what :func:`fit_groups` returned, stored with the whitening),
    as the end of a sentence ("its ..."); None if nothing: ``mean`` ``(dim,)``, ``transform`` ``(dim, dim)``,
    ``phi`` ``(dim,)`` > 0 (:func:`vb` takes its square root and divides by ``1 + phi``), all finite."""
    if not isinstance(plda, dict):
        return "whitening's PLDA model is not a table of tensors"
    for key, ndim in (("mean", 1), ("transform", 2), ("phi", 1)):
        problem = tensor_problem(plda.get(key), f"PLDA model's {key}", ndim)
        if problem:
            return problem
    dim = plda["mean"].shape[0]
    for key, shape in (("transform", (dim, dim)), ("phi", (dim,))):
        if tuple(plda[key].shape) != shape:
            return f"PLDA model's {key} is {tuple(plda[key].shape)}, its mean {dim}-dimensional"
    if not bool((plda["phi"] > 0).all()):
        return "PLDA model's phi (between-speaker variances) holds values <= 0"
    return None


def project(embeddings: np.ndarray, plda: dict, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """``embeddings (n, dim)`` in the PLDA space's first ``dims`` dimensions, and their ``phi``."""
    mean, transform, phi = (np.asarray(plda[k], dtype=np.float64) for k in ("mean", "transform", "phi"))
    if embeddings.shape[1] != mean.shape[0]:
        raise BadValue(f"the model file's PLDA model is for {mean.shape[0]}-dimensional embeddings, these have "
                       f"{embeddings.shape[1]}: fitted with another speaker encoder")
    x = _norm(_norm(np.asarray(embeddings, dtype=np.float64)) - mean) * np.sqrt(mean.shape[0])
    return x @ transform[:, :dims], phi[:dims]


def vb(y: np.ndarray, phi: np.ndarray, init: np.ndarray, *, fa: float, fb: float, weights: np.ndarray | None = None,
       smoothing: float = 7.0, iters: int = 40, tol: float = 1e-6) -> np.ndarray:
    """Responsibilities ``(n, speakers)`` of the pieces ``y (n, dims)`` (PLDA space) after variational Bayes
    from the labels ``init (n,)`` (softened: ``softmax(smoothing * one_hot)``); ``weights`` count a piece as
    that many observations (default 1). A speaker no piece keeps has a column of zeros."""
    if not (fa > 0 and fb > 0):
        raise BadValue(f"VBx needs fa > 0 and fb > 0, got fa={fa}, fb={fb}")
    n, d = y.shape
    k = int(init.max()) + 1
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    logits = smoothing * np.eye(k)[init]
    gamma = np.exp(logits - logits.max(1, keepdims=True))
    gamma /= gamma.sum(1, keepdims=True)
    pi = np.full(k, 1.0 / k)
    g = -0.5 * ((y**2).sum(1) + d * np.log(2 * np.pi))
    rho = y * np.sqrt(phi)
    for _ in range(iters):
        wg = gamma * w[:, None]
        inv_l = 1.0 / (1.0 + (fa / fb) * wg.sum(0)[:, None] * phi)  # speakers, d: the posterior's variances
        alpha = (fa / fb) * inv_l * (wg.T @ rho)  # speakers, d: the posterior's means
        log_p = fa * (rho @ alpha.T - 0.5 * (inv_l + alpha**2) @ phi + g[:, None])
        log_p += np.log(np.maximum(pi, 1e-300))
        new = np.exp(log_p - log_p.max(1, keepdims=True))
        new /= new.sum(1, keepdims=True)
        pi = (new * w[:, None]).sum(0)
        pi /= pi.sum()
        done = np.abs(new - gamma).max() < tol
        gamma = new
        if done:
            break
    return gamma


def cluster_vbx(embeddings: np.ndarray, plda: dict, *, threshold: float, fa: float, fb: float, dims: int,
                weights: np.ndarray | None = None, num_speakers: int | None = None, min_speakers: int | None = None,
                max_speakers: int | None = None, min_weight: float = 0.0) -> np.ndarray:
    """Cluster labels ``(n,)`` in 0..K-1: the agglomerative clusters cut at ``threshold`` (cosine distance),
    refined by :func:`vb` in the PLDA space (each piece to its likeliest speaker; speakers left without pieces
    leave), clusters of less than ``min_weight`` folded as in :func:`cluster.cluster`. Above the given bounds
    the closest centroids merge; below them, the tree's clustering within the bounds is used instead."""
    from .cluster import _relabel, check_speaker_counts, cluster, fold_small, merge_closest

    lo, hi = check_speaker_counts(num_speakers, min_speakers, max_speakers)
    x = np.asarray(embeddings, dtype=np.float64)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    init = cluster(x, threshold=threshold, weights=w, reassign=False)  # VBx reassigns itself
    if len(x) < 2:
        return init
    y, phi = project(x, plda, dims)
    labels = vb(y, phi, init, fa=fa, fb=fb).argmax(1)
    labels = fold_small(_norm(x), labels, w, min_weight, lo)
    if len(np.unique(labels)) < lo:  # VBx merged below the bounds: the tree's clustering within them
        return cluster(x, threshold=threshold, weights=w, min_speakers=lo, max_speakers=hi, min_weight=min_weight,
                       reassign=False)
    return _relabel(merge_closest(_norm(x), labels, w, lo, down_to=hi), w)  # above them: the closest merge
