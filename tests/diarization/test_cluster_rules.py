"""The clustering's rules on cases built for each: weighted centroids, labels by speech, folding small clusters,
embedding norms ignored."""
import math

import numpy as np

from normlab.diarization.pipeline.cluster import cluster, fold_small, nearest_centroid


def _u(deg):
    return np.array([math.cos(math.radians(deg)), math.sin(math.radians(deg))])

def test_nearest_centroid_uses_weighted_centroids():
    """Cluster 0: 0 deg (weight 10) and 90 deg (weight 0.1): its weighted centroid is near 0 deg. Cluster 1: 30 deg
    and 43 deg. The 43 deg row is nearer cluster 1's centroid than cluster 0's (it would not be unweighted: 45 deg)."""
    x = np.stack([_u(0), _u(90), _u(30), _u(43)])
    w = np.array([10.0, 0.1, 1.0, 0.01])
    moved = nearest_centroid(x, np.array([0, 0, 1, 1]), w)
    assert moved[3] == 1 and moved[0] == 0

def test_labels_ordered_by_speech_weight_not_piece_count():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(16), rng.standard_normal(16)
    x = np.stack([a + 0.01 * rng.standard_normal(16) for _ in range(5)]
                 + [b + 0.01 * rng.standard_normal(16) for _ in range(2)])
    w = np.array([0.1] * 5 + [5.0] * 2)
    labels = cluster(x, threshold=0.5, weights=w)
    assert labels.tolist() == [1] * 5 + [0] * 2  # spk0: the voice with the most speech

def _three_clusters():
    rng = np.random.default_rng(1)
    c = rng.standard_normal((3, 16))
    x = np.stack([c[k] + 0.01 * rng.standard_normal(16) for k in (0, 0, 1, 2)])
    return x / np.linalg.norm(x, axis=1, keepdims=True), np.array([0, 0, 1, 2])

def test_a_cluster_of_exactly_min_weight_stays():
    x, labels = _three_clusters()
    out = fold_small(x, labels, np.array([5.0, 5.0, 2.0, 2.0]), 2.0)
    assert len(set(out.tolist())) == 3

def test_the_smallest_cluster_folds_first():
    x, labels = _three_clusters()
    out = fold_small(x, labels, np.array([5.0, 5.0, 0.5, 1.5]), 2.0, lo=2)
    assert out[3] == 2 and out[2] != 1  # cluster 1 (0.5) folded, cluster 2 (1.5) kept at lo=2

def test_a_small_cluster_folds_into_a_large_one_only():
    """The two small clusters are closest to each other, but each folds into the large one."""
    rng = np.random.default_rng(2)
    big, s = rng.standard_normal(16), rng.standard_normal(16)
    x = np.stack([big, big + 0.01 * rng.standard_normal(16), s, s + 0.3 * rng.standard_normal(16)])
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    out = fold_small(x, np.array([0, 0, 1, 2]), np.array([5.0, 5.0, 0.5, 1.6]), 2.0)
    assert out.tolist() == [0, 0, 0, 0]

def test_cluster_ignores_embedding_norms():
    """Rows are L2-normalized first: scaling each embedding changes nothing, folding and merging included."""
    for seed in range(13):
        r = np.random.default_rng(seed)
        k = r.integers(2, 4)
        c, truth = r.standard_normal((k, 32)), np.repeat(np.arange(k), 6)
        x = c[truth] + r.uniform(0.5, 1.5) * r.standard_normal((k * 6, 32))
        scale = np.exp(r.uniform(-2, 2, k * 6))[:, None]
        for kw in ({"threshold": 0.7}, {"threshold": 0.7, "min_weight": 3.0}, {"threshold": 0.5, "merge": 0.5}):
            assert cluster(x * scale, **kw).tolist() == cluster(x, **kw).tolist(), (seed, kw)


def test_where_no_cluster_reaches_the_floor_the_largest_stands_for_the_large_ones():
    """In 10 s of two voices every cluster was under the 8 s floor, so none was folded: pieces of 0.5-0.9 s each
    became a speaker (4), and a larger floor gave more speakers than a smaller one."""
    x, labels = _three_clusters()
    w = np.array([1.75, 1.75, 0.9, 0.5])  # clusters of 3.5, 0.9 and 0.5 s
    assert set(fold_small(x, labels, w, 8.0).tolist()) == {0}
    assert len(set(fold_small(x, labels, w, 8.0, lo=2).tolist())) == 2  # never below the count asked for
    counts = [len(set(fold_small(x, labels, w, floor).tolist())) for floor in (0.5, 0.9, 2.0, 8.0)]
    assert counts == sorted(counts, reverse=True) == [3, 2, 1, 1]  # a larger floor never gives more speakers
