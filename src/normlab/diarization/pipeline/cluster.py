"""Agglomerative clustering of speaker embeddings across a recording.

Average-linkage agglomerative clustering on cosine distance; the tree is cut
at a distance threshold (tuned on a development set). Clusters that carry
little speech (less than ``min_weight``: a few stray windows) are folded
into the nearest large cluster. A speaker count bounds the result: below
``min_speakers`` (or ``num_speakers``) the tree is cut deeper until that many
clusters carry ``min_weight`` each; above ``max_speakers`` the clusters with
the closest centroids merge, after the folding.
"""
from __future__ import annotations

import numpy as np

from ..._checks import BadValue


def check_speaker_counts(num_speakers: int | None = None, min_speakers: int | None = None,
                         max_speakers: int | None = None) -> tuple[int, int | None]:
    """Validate the speaker-count options; returns ``(lo, hi)`` (``hi`` None: unbounded). One-line ValueErrors."""
    for name, v in (("num_speakers", num_speakers), ("min_speakers", min_speakers), ("max_speakers", max_speakers)):
        if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1):
            raise BadValue(f"{name} must be a positive integer, got {v!r}")
    if num_speakers is not None:  # bounds that hold it are kept quiet (pyannote's num_speakers overrides them)
        if (min_speakers is not None and min_speakers > num_speakers) or \
                (max_speakers is not None and max_speakers < num_speakers):
            given = ", ".join(f"{n}={v}" for n, v in (("min_speakers", min_speakers), ("max_speakers", max_speakers))
                              if v is not None and v != num_speakers)
            raise BadValue(f"num_speakers={num_speakers} (exactly that many) contradicts {given}: give one or the "
                           "other")
        return int(num_speakers), int(num_speakers)
    lo = 1 if min_speakers is None else int(min_speakers)
    if max_speakers is not None and lo > max_speakers:
        raise BadValue(f"min_speakers ({lo}) is greater than max_speakers ({max_speakers})")
    return lo, None if max_speakers is None else int(max_speakers)


def _centroids(x: np.ndarray, labels: np.ndarray, w: np.ndarray) -> np.ndarray:
    ks = np.unique(labels)
    c = np.stack([(x[labels == k] * w[labels == k, None]).sum(0) for k in ks])
    return c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)


def _relabel(labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Labels 0..K-1, the cluster with the most weight first."""
    ks = np.unique(labels)
    order = sorted(ks, key=lambda k: -weights[labels == k].sum())
    mapping = {k: i for i, k in enumerate(order)}
    return np.array([mapping[k] for k in labels], dtype=np.int64)


def fold_small(x: np.ndarray, labels: np.ndarray, w: np.ndarray, min_weight: float, lo: int = 1) -> np.ndarray:
    """``labels`` with each cluster of less than ``min_weight`` total weight folded into the nearest (centroid
    cosine) cluster that has more, smallest first, never below ``lo`` clusters; ``x`` L2-normalized rows.
    Where no cluster has that much (a recording of a few seconds of speech), the largest stands for the large
    ones: the pieces of 0.5 s it splits into were each kept as a speaker (4 in 10 s of two voices), and a
    larger floor gave more speakers than a smaller one."""
    labels = labels.copy()
    min_weight = min(min_weight, max((float(w[labels == c].sum()) for c in np.unique(labels)), default=0.0))
    while min_weight > 0:
        ks = np.unique(labels)
        mass = np.array([w[labels == c].sum() for c in ks])
        small = [i for i in np.argsort(mass) if mass[i] < min_weight]
        if not small or len(ks) <= lo:
            break
        i = small[0]
        cents = _centroids(x, labels, w)
        sims = cents @ cents[i]
        sims[i] = -np.inf
        sims[[j for j in range(len(ks)) if mass[j] < min_weight]] = -np.inf  # into a large cluster
        labels[labels == ks[i]] = ks[int(np.argmax(sims))]
    return labels


def nearest_centroid(x: np.ndarray, labels: np.ndarray, w: np.ndarray, lo: int = 1) -> np.ndarray:
    """``labels`` with every row of ``x`` (L2-normalized) moved to the cluster of the nearest weighted centroid
    (cosine); unchanged where that would leave fewer than ``lo`` clusters."""
    ks = np.unique(labels)
    if len(ks) < 2:
        return labels
    moved = ks[np.argmax(x @ _centroids(x, labels, w).T, axis=1)]
    return moved if len(np.unique(moved)) >= min(lo, len(ks)) else labels


def merge_closest(x: np.ndarray, labels: np.ndarray, w: np.ndarray, lo: int = 1, *, below: float = 0.0,
                  down_to: int | None = None) -> np.ndarray:
    """``labels`` with the two clusters of the closest weighted centroids (cosine, ``x`` L2-normalized rows)
    merged, again and again, while they are closer than ``below`` or there are more than ``down_to``
    clusters; never below ``lo`` clusters."""
    labels = labels.copy()
    while True:
        ks = np.unique(labels)
        if len(ks) <= max(lo, 1):
            return labels
        cents = _centroids(x, labels, w)
        dist = 1 - cents @ cents.T
        np.fill_diagonal(dist, np.inf)
        i, j = np.unravel_index(int(np.argmin(dist)), dist.shape)
        if (below <= 0 or dist[i, j] >= below) and (down_to is None or len(ks) <= down_to):
            return labels
        labels[labels == ks[j]] = ks[i]


def _deeper(tree: np.ndarray, w: np.ndarray, lo: int, min_weight: float, start: int) -> np.ndarray | None:
    """The tree cut at the fewest clusters, from ``start`` (the threshold cut's count) on, that give ``lo``
    clusters of at least ``min_weight`` each (the small ones are folded afterwards): a shallower cut, or one at
    exactly ``lo``, would make a few outlying short pieces a cluster of their own and leave the voices merged.
    None where no cut gives that many."""
    from scipy.cluster.hierarchy import fcluster

    if min_weight > 0 and w.sum() < lo * min_weight:  # not speech enough for lo such clusters in any cut
        return None
    for m in range(max(lo, start), len(w) + 1):
        labels = fcluster(tree, t=m, criterion="maxclust")
        if _n_big(labels, w, min_weight) >= lo:
            return labels
    return None


def _n_big(labels: np.ndarray, w: np.ndarray, min_weight: float) -> int:
    """How many clusters have at least ``min_weight`` (all of them where it is 0)."""
    mass = np.bincount(np.unique(labels, return_inverse=True)[1], weights=w)
    return int(np.sum(mass >= min_weight)) if min_weight > 0 else len(mass)


def cluster(embeddings: np.ndarray, *, threshold: float, weights: np.ndarray | None = None,
            num_speakers: int | None = None, min_speakers: int | None = None, max_speakers: int | None = None,
            min_weight: float = 0.0, merge: float = 0.0, reassign: bool = True) -> np.ndarray:
    """Cluster labels ``(n,)`` in 0..K-1 for embeddings ``(n, dim)``.

    Parameters
    ----------
    embeddings : (n, dim) float; rows are L2-normalized here
    threshold : cosine distance (1 - cosine similarity) at which the average-linkage tree is cut
    weights : (n,) float, e.g. seconds of speech behind each embedding (default 1)
    num_speakers, min_speakers, max_speakers : the speaker count, exact or bounded
    min_weight : clusters with less total weight are merged into the nearest bigger cluster
    merge : then, while two clusters' weighted centroids are closer than this cosine distance, the closest two
        merge (0: never), never below the requested minimum. The tree's average linkage compares every pair
        of pieces, and short pieces' embeddings scatter: one voice can average farther from itself than its
        centroid does; a centroid is the mean of many pieces
    reassign : last, each embedding moves to the cluster of its nearest centroid (``nearest_centroid``)
    """
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import pdist

    lo, hi = check_speaker_counts(num_speakers, min_speakers, max_speakers)
    x = np.asarray(embeddings, dtype=np.float64)
    if not np.isfinite(x).all():
        raise BadValue("embeddings hold NaN or infinite values")
    n = x.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    # a row of zeros (a piece its encoder heard nothing in) has no direction: 1 from every other, as orthogonal
    # (scipy's cosine made it NaN, and the tree refused the whole recording)
    dist = pdist(x, metric="cosine")
    tree = linkage(np.nan_to_num(dist, nan=1.0), method="average")
    labels = fcluster(tree, t=threshold, criterion="distance")
    lo = min(lo, n)
    if lo > 1 and _n_big(labels, w, min_weight) < lo:  # too few voices at the cut (short outliers do not count)
        deeper = _deeper(tree, w, lo, min_weight, start=len(np.unique(labels)))
        if deeper is not None:
            labels = deeper
        elif len(np.unique(labels)) < lo:
            labels = fcluster(tree, t=lo, criterion="maxclust")
    labels = fold_small(x, labels, w, min_weight, lo)
    # too many: the closest centroids merge, after the small clusters folded. (The tree cut at the asked count
    # instead split off a few outlying short pieces as speakers of their own and merged the real ones.)
    labels = merge_closest(x, labels, w, lo, below=merge, down_to=hi)
    if reassign:
        labels = nearest_centroid(x, labels, w, lo)
    return _relabel(labels, w)
