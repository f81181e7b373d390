"""Clustering recovers 3 and 4 speakers from synthetic embeddings; speaker-count options; stitching of windows
whose local speaker order flips into global speakers with overlap kept."""
import numpy as np
import pytest
import torch

from normlab.diarization.pipeline.cluster import check_speaker_counts, cluster, nearest_centroid
from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.segment import Segmentation, window_starts
from normlab.diarization.pipeline.stitch import stitch


def _speakers(k: int, per: int, noise: float, seed: int = 0):
    """``per`` embeddings around each of ``k`` random directions (256-dim), shuffled; returns x and true labels."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, 256))
    truth = np.repeat(np.arange(k), per)
    x = centres[truth] + noise * rng.standard_normal((k * per, 256)) * np.linalg.norm(centres, axis=1).mean() / 16
    order = rng.permutation(len(truth))
    return x[order], truth[order]


def _same_partition(a, b) -> bool:
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("k", [3, 4])
def test_threshold_recovers_speakers(k):
    x, truth = _speakers(k, 12, noise=0.3, seed=k)
    labels = cluster(x, threshold=0.5)
    assert len(set(labels.tolist())) == k and _same_partition(labels, truth)


@pytest.mark.parametrize("k", [3, 4])
def test_num_speakers_and_bounds(k):
    x, truth = _speakers(k, 10, noise=0.3, seed=10 + k)
    assert _same_partition(cluster(x, threshold=1.9, num_speakers=k), truth)  # threshold alone would merge all
    assert _same_partition(cluster(x, threshold=1.9, min_speakers=k), truth)
    assert len(set(cluster(x, threshold=0.01, max_speakers=k).tolist())) == k  # threshold alone would split all
    assert len(set(cluster(x, threshold=0.5, max_speakers=2).tolist())) == 2


def test_small_clusters_fold_into_large_ones():
    x, truth = _speakers(3, 10, noise=0.3, seed=3)
    w = np.where(truth == 2, 0.1, 1.0)  # speaker 2 has almost no speech
    labels = cluster(x, threshold=0.5, weights=w, min_weight=2.0)
    assert len(set(labels.tolist())) == 2
    assert len(set(cluster(x, threshold=0.5, weights=w, min_weight=2.0, min_speakers=3).tolist())) == 3


def _voices_and_strays(per_voice: int) -> Segmentation:
    """Two voices of ``per_voice`` 2 s pieces each, plus five 2 s pieces (10 s) of the first voice that its
    embedding places apart (a voice's outlying pieces: overlap, noise); one window per piece."""
    rng = np.random.default_rng(0)
    centres = np.eye(3, 16)
    truth = [0] * per_voice + [1] * per_voice + [2] * 5
    emb = centres[truth] + 0.05 * rng.standard_normal((len(truth), 16))
    size = 20
    probs = torch.full((len(truth), size, 1), 0.9)
    pieces = [(i, 0, 0, size, i) for i in range(len(truth))]
    return Segmentation("rec", size * len(truth), 0.1, [size * i for i in range(len(truth))], probs, pieces,
                        torch.tensor(emb).float(), np.full(len(truth), 2.0))


@pytest.mark.parametrize("per_voice, share, speakers", [(100, 0.04, 2), (100, 0.0, 3), (10, 0.04, 3)])
def test_the_cluster_floor_grows_with_a_long_recording(per_voice, share, speakers):
    """10 s of stray pieces pass the 4 s floor. In 410 s of speech they are under 4% of it and fold into a voice;
    without the share they stay a speaker of their own, as they do in 50 s of speech (4% of it is under 4 s)."""
    seg = _voices_and_strays(per_voice)
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=4.0, min_cluster_share=share)
    assert len({t.speaker for t in stitch(seg, cfg)}) == speakers


def test_a_speaker_count_keeps_a_minor_voice_under_the_share():
    """Three speakers asked for, one of them 12 s of a 422 s recording (under 4%): with the share in the floor the
    count-given cut found no three clusters above it, split a large voice instead and folded the minor one."""
    rng = np.random.default_rng(0)
    centres = np.eye(3, 16)
    truth = np.array([0] * 100 + [1] * 100 + [2] * 6)
    emb = centres[truth] + 0.05 * rng.standard_normal((len(truth), 16))
    size = 20
    seg = Segmentation("rec", size * len(truth), 0.1, [size * i for i in range(len(truth))],
                       torch.full((len(truth), size, 1), 0.9), [(i, 0, 0, size, i) for i in range(len(truth))],
                       torch.tensor(emb).float(), np.full(len(truth), 2.0))
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=4.0, min_cluster_share=0.04)
    got = {}
    for t in stitch(seg, cfg, num_speakers=3):
        a, b = round(t.start / 2), round(t.end / 2)  # 2 s a piece
        got.setdefault(t.speaker, set()).update(truth[a:b].tolist())
    assert sorted(map(sorted, got.values())) == [[0], [1], [2]], got


def test_merge_joins_a_voice_the_tree_split_whose_centroids_agree():
    rng = np.random.default_rng(5)
    a, far = rng.standard_normal(256), rng.standard_normal(256)
    pieces = lambda c, n: c + 0.6 * rng.standard_normal((n, 256)) * np.linalg.norm(c) / 16  # noqa: E731
    # one voice: pieces scattered around one centre (pairwise cosine distance ~0.26, the centroid far closer);
    # another voice far away
    x = np.concatenate([pieces(a, 20), pieces(far, 20)])
    truth = np.repeat([0, 1], 20)
    split = cluster(x, threshold=0.15)  # the average linkage over scattered pieces: more than 2 clusters
    assert len(set(split.tolist())) > 2
    merged = cluster(x, threshold=0.15, merge=0.3)
    assert _same_partition(merged, truth)
    assert len(set(cluster(x, threshold=0.15, merge=0.3, min_speakers=3).tolist())) == 3  # never below the minimum
    assert np.array_equal(cluster(x, threshold=0.15, merge=0.0), split)  # 0: no merging


def test_a_piece_the_tree_chains_to_the_wrong_voice_moves_to_its_nearest_centroid():
    """Voice A's pieces scatter, voice B's are tight; a stray piece lies nearer A's centroid than B's, but nearer
    B's pieces on average than A's (each of A's pieces is far from it): average linkage puts it with B, the
    centroids with A."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(64), rng.standard_normal(64)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    A = a + 0.9 * rng.standard_normal((12, 64)) / 8
    B = b + 0.15 * rng.standard_normal((12, 64)) / 8
    stray = 0.55 * a + 0.45 * b
    x = np.vstack([A, B, stray[None]])
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    centre = lambda rows: rows.mean(0) / np.linalg.norm(rows.mean(0))  # noqa: E731
    assert unit[-1] @ centre(unit[:12]) > unit[-1] @ centre(unit[12:24])  # nearer A's centroid...
    assert (unit[:12] @ unit[-1]).mean() < (unit[12:24] @ unit[-1]).mean()  # ...but nearer B's pieces on average
    tree = cluster(x, threshold=0.8, reassign=False)
    moved = cluster(x, threshold=0.8)
    assert len(set(tree.tolist())) == len(set(moved.tolist())) == 2
    assert tree[-1] == tree[12] != tree[0]  # the tree: with B
    assert moved[-1] == moved[0] != moved[12]  # the centroids: with A
    assert _same_partition(moved[:24], tree[:24])  # the other pieces stay


def test_reassignment_never_leaves_fewer_clusters_than_asked():
    """Cluster 2 holds one piece of each other cluster's voice: each moves to its own voice's centroid and
    cluster 2 would vanish; with three clusters asked for, the labels stay as they were."""
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    labels = np.array([0, 0, 1, 1, 2, 2])
    w = np.ones(6)
    assert nearest_centroid(x, labels, w, lo=1).tolist() == [0, 0, 1, 1, 0, 1]
    assert nearest_centroid(x, labels, w, lo=3).tolist() == labels.tolist()
    assert nearest_centroid(x, np.zeros(6, dtype=np.int64), w).tolist() == [0] * 6


def test_speaker_count_errors():
    for bad in (dict(num_speakers=0), dict(min_speakers=3, max_speakers=2), dict(max_speakers=-1),
                dict(num_speakers=2, min_speakers=3), dict(num_speakers=4, min_speakers=1, max_speakers=3)):
        with pytest.raises(ValueError):
            check_speaker_counts(**bad)
    assert check_speaker_counts() == (1, None)
    # bounds that hold num_speakers: exactly that many (refused before; code written for pyannote passes them)
    assert check_speaker_counts(num_speakers=2, min_speakers=1, max_speakers=3) == (2, 2)
    assert check_speaker_counts(num_speakers=2, max_speakers=3) == (2, 2)
    assert check_speaker_counts(min_speakers=2, max_speakers=2) == (2, 2)  # equal bounds: exactly that many
    # the contradiction names what was given ("min_speakers=None, max_speakers=1" named an option not given)
    with pytest.raises(ValueError, match=r"^num_speakers=2 \(exactly that many\) contradicts max_speakers=1: "):
        check_speaker_counts(num_speakers=2, max_speakers=1)


@pytest.mark.parametrize("k", [2, 3])
def test_equal_bounds_give_that_many_speakers(k):
    x, truth = _speakers(3, 10, noise=0.3, seed=20 + k)
    labels = cluster(x, threshold=0.5, min_speakers=k, max_speakers=k)
    assert len(set(labels.tolist())) == k
    assert cluster(np.zeros((0, 4)), threshold=0.5).shape == (0,)


def test_stitching_maps_flipped_local_speakers_to_global_ones():
    """Windows of 20 frames every 10, 2 local speakers, 3 global speakers; the local order flips between windows.
    The embeddings say who is who; the result must follow them (overlap kept), not the local column order."""
    frames, size, step = 60, 20, 10
    truth = torch.zeros(frames, 3)
    truth[0:22, 0] = 1
    truth[15:45, 1] = 1  # overlaps speaker 0 on 15-22 and speaker 2 on 42-45
    truth[42:60, 2] = 1
    starts = window_starts(frames, size, step)
    rng = np.random.default_rng(0)
    centres = np.eye(3, 8)
    probs, pieces, emb = [], [], []
    for w, s0 in enumerate(starts):
        present = [k for k in range(3) if truth[s0 : s0 + size, k].any()]
        assert len(present) <= 2
        present = present[::-1] if w % 2 else present  # the local order flips
        local = torch.zeros(size, 2)
        for j, k in enumerate(present):
            local[:, j] = truth[s0 : s0 + size, k] * 0.9
            pieces.append((w, j, 0, size, len(emb)))
            emb.append(centres[k] + 0.05 * rng.standard_normal(8))
        probs.append(local)
    seg = Segmentation("rec", frames, 0.1, starts, torch.stack(probs), pieces, torch.tensor(np.array(emb)).float(),
                       np.ones(len(emb)) * 2.0)
    turns = stitch(seg, PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0))
    got = torch.zeros(frames, 3)
    names = sorted({t.speaker for t in turns})
    assert len(names) == 3
    for t in turns:
        got[round(t.start / 0.1) : round(t.end / 0.1), names.index(t.speaker)] = 1
    order = [max(range(3), key=lambda j: (got[:, j] * truth[:, k]).sum().item()) for k in range(3)]
    assert sorted(order) == [0, 1, 2]
    assert torch.equal(got[:, order], truth)  # every frame right, both overlaps kept


def test_speaker_count_per_frame_is_the_rounded_mean_over_windows():
    """Frames 10-19 are seen by two windows: the first hears its two local speakers there, the second nobody.
    The mean count is 1, so one global speaker (the likelier) talks there; the maximum (2) would switch both on."""
    size, starts = 20, [0, 10]
    probs = torch.zeros(2, size, 2)
    probs[0, :, 0], probs[0, :, 1] = 0.9, 0.8  # window 0 (frames 0-19): both local speakers throughout
    pieces = [(0, 0, 0, size, 0), (0, 1, 0, size, 1)]  # window 1 (frames 10-29): no speech, no pieces
    seg = Segmentation("rec", 30, 0.1, starts, probs, pieces, torch.eye(2, 8), np.array([3.0, 2.0]))  # spk0 first
    turns = stitch(seg, PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0))
    got = sorted((t.speaker, round(t.start, 3), round(t.end, 3)) for t in turns)
    assert got == [("spk0", 0.0, 2.0), ("spk1", 0.0, 1.0)], got  # both on 0-9 (one window: 2); the likelier on 10-19


def test_stitch_fills_a_speakers_pauses_shorter_than_fill_gap():
    """One window hears one speaker with a 0.3 s and a 0.6 s pause: fill_gap 0.5 bridges the first only."""
    probs = torch.full((1, 30, 1), 0.9)
    probs[0, 5:8, 0] = probs[0, 15:21, 0] = 0.1
    seg = Segmentation("rec", 30, 0.1, [0], probs, [(0, 0, 0, 30, 0)], torch.eye(1, 8), np.array([3.0]))

    def runs(gap):
        cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0, fill_gap=gap)
        return [(round(t.start, 3), round(t.end, 3)) for t in stitch(seg, cfg)]

    assert runs(0.0) == [(0.0, 0.5), (0.8, 1.5), (2.1, 3.0)]
    assert runs(0.5) == [(0.0, 1.5), (2.1, 3.0)]


def test_stitch_in_speech_mode_fills_no_pause_into_another_speakers_turn():
    """speech mode gives one speaker at a time: A, a 0.3 s turn of B, A again; fill_gap 0.5 filled A's pause
    over B's turn (two speakers at once)."""
    probs = torch.full((1, 23, 1), 0.9)  # one local speaker, speech throughout
    pieces = [(0, 0, 0, 10, 0), (0, 0, 10, 13, 1), (0, 0, 13, 23, 2)]
    emb = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [1.0, 0.01, 0, 0]])
    seg = Segmentation("rec", 23, 0.1, [0], probs, pieces, emb, np.array([1.0, 0.3, 1.0]))
    for gap in (0.0, 0.5):
        cfg = PipelineConfig(speakers="speech", min_cluster=0.0, min_cluster_share=0.0, median=1, fill_gap=gap)
        got = [(t.speaker, round(t.start, 3), round(t.end, 3)) for t in stitch(seg, cfg)]
        assert got == [("spk0", 0.0, 1.0), ("spk1", 1.0, 1.3), ("spk0", 1.3, 2.3)], (gap, got)


def test_offset_threshold_holds_a_fading_turn_on():
    """One window, one speaker at 0.9 on frames 0-9, then fading (0.3) on 10-14, then 0.05: at the speech threshold
    (0.5) alone the turn ends at 1.0 s; held on while above 0.15 (the default) it ends at 1.5 s; 1 turns it off."""
    probs = torch.full((1, 30, 1), 0.05)
    probs[0, :10, 0], probs[0, 10:15, 0] = 0.9, 0.3
    seg = Segmentation("rec", 30, 0.1, [0], probs, [(0, 0, 0, 30, 0)], torch.eye(1, 8), np.array([3.0]))

    def end(**kw):
        cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0, **kw)
        return [(round(t.start, 3), round(t.end, 3)) for t in stitch(seg, cfg)]

    assert end() == [(0.0, 1.5)]
    assert end(offset_threshold=1.0) == [(0.0, 1.0)]
    with pytest.raises(ValueError, match="offset_threshold"):
        PipelineConfig.for_model(None, offset_threshold=1.5)


def test_the_seams_a_hold_makes_are_smoothed_like_the_rest():
    """Two speakers, a silent gap between them where both stay likely: the first is the likelier on its half of
    the gap, the second on the other, except one frame each. Held on, each gap frame goes to its likelier
    speaker, and the filter removes the one-frame blips, as it does the model's own (they were left as turns)."""
    probs = torch.zeros(1, 30, 2)
    probs[0, :10, 0] = probs[0, 20:, 1] = 0.9
    probs[0, 10:20, 0] = torch.tensor([0.3, 0.3, 0.2, 0.3, 0.3, 0.2, 0.2, 0.3, 0.2, 0.2])
    probs[0, 10:20, 1] = 0.5 - probs[0, 10:20, 0]
    seg = Segmentation("rec", 30, 0.1, [0], probs, [(0, 0, 0, 30, 0), (0, 1, 0, 30, 1)], torch.eye(2, 8),
                       np.array([3.0, 2.0]))
    turns = stitch(seg, PipelineConfig(threshold=0.5, median=3, cluster_threshold=0.5, min_cluster=0.0))
    assert [(t.speaker, round(t.start, 3), round(t.end, 3)) for t in sorted(turns)] == [
        ("spk0", 0.0, 1.5), ("spk1", 1.5, 3.0)], turns


def test_hamming_weighting_trusts_a_window_middle_over_another_window_edge():
    """Frames 10-19 are seen by window 0 (which hears a speaker) and window 1 (which hears nobody). Weighted alike,
    the mean count there is 0.5, rounded up: the speaker talks to frame 19. With Hamming weights each frame goes
    to the window it is nearer the middle of: 10-14 to window 0 (speech), 15-19 to window 1 (silence)."""
    size, starts = 20, [0, 10]
    probs = torch.zeros(2, size, 1)
    probs[0, :, 0] = 0.9  # window 0 (frames 0-19) hears one speaker throughout; window 1 (10-29) nobody
    pieces = [(0, 0, 0, size, 0)]
    seg = Segmentation("rec", 30, 0.1, starts, probs, pieces, torch.eye(1, 8), np.array([3.0]))
    ends = {}
    for w in ("mean", "hamming"):
        turns = stitch(seg, PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0,
                                           weighting=w, offset_threshold=1.0))  # the weighting alone
        ends[w] = max(t.end for t in turns)
    assert ends["mean"] == pytest.approx(2.0)
    assert ends["hamming"] == pytest.approx(1.5)


def test_overlap_threshold_sets_how_sure_a_second_speaker_must_be():
    """One window, two local speakers: the first at 0.9 throughout, the second at 0.65 on frames 5-14. With the
    overlap threshold at the speech threshold (0.5) both talk there; at 0.7 only the likelier; the first speaker
    alone is never held to the overlap threshold (at 0.95 it still talks)."""
    size = 20
    probs = torch.zeros(1, size, 2)
    probs[0, :, 0], probs[0, 5:15, 1] = 0.9, 0.65
    seg = Segmentation("rec", size, 0.1, [0], probs, [(0, 0, 0, size, 0), (0, 1, 0, size, 1)], torch.eye(2, 8),
                       np.array([3.0, 2.0]))
    def speakers(overlap):
        cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0,
                             overlap_threshold=overlap)
        return sorted((t.speaker, round(t.start, 3), round(t.end, 3)) for t in stitch(seg, cfg))
    assert speakers(None) == speakers(0.5) == [("spk0", 0.0, 2.0), ("spk1", 0.5, 1.5)]
    assert speakers(0.7) == [("spk0", 0.0, 2.0)]
    assert speakers(0.95) == [("spk0", 0.0, 2.0)]
    with pytest.raises(ValueError, match="overlap_threshold"):
        PipelineConfig.for_model(None, overlap_threshold=1.5)


@pytest.mark.parametrize("setting, message", [
    ({"piece": 0.0}, "piece must be"), ({"piece": float("nan")}, "piece must be"), ({"window": float("inf")}, "window"),
    ({"min_embed": float("nan")}, "min_embed"), ({"max_embed": 0.0}, "max_embed"), ({"batch": 0}, "batch"),
    ({"silence_db": float("nan")}, "silence_db"), ({"threshold": "0.5"}, "threshold must be"),
    ({"whiten": "no"}, "whiten must be True or False"), ({"cluster_threshold": 5.0}, "cluster_threshold"),
    ({"cluster_threshold": float("nan")}, "cluster_threshold"), ({"min_cluster": -5.0}, "min_cluster"),
    ({"min_cluster_share": 1.0}, "min_cluster_share"), ({"min_cluster_share": -0.1}, "min_cluster_share"),
    ({"merge_threshold": float("nan")}, "merge_threshold"), ({"step": 20.0}, "step <= window"),
    ({"median": True}, "median must be"), ({"vbx_dims": True}, "vbx_dims must be"),
])
def test_each_pipeline_setting_is_checked_where_it_is_made(setting, message):
    """A setting that cannot work is one clear line, from the API too (they gave empty results, or a NaN or a string
    failed deep inside segmentation)."""
    with pytest.raises(ValueError, match=message):
        PipelineConfig(**setting)
    with pytest.raises(ValueError, match=message):
        PipelineConfig.for_model(None, **setting)


@pytest.mark.parametrize("bounds", [{"num_speakers": 2}, {"max_speakers": 2}, {"max_speakers": 3},
                                    {"min_speakers": 2}, {}])
def test_a_given_count_does_not_make_outlying_pieces_a_speaker(bounds):
    """Two voices of 12 pieces each and two short outlying pieces. The tree was cut at the asked count (2):
    the outliers, farther from everything than the two voices from each other, became one speaker and the
    two voices were merged into the other (real files: DER 3.6% without --num-speakers 2, 42% with it). Now
    the cut at the threshold, the small clusters folded, then the closest centroids merged down to the
    bound."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(256), rng.standard_normal(256)
    b = b - (b @ a) / (a @ a) * a  # orthogonal voices: cosine distance 1 between them
    odd = -(a + b)  # the outliers: cosine distance about 1.7 from both voices
    x = np.stack([a + 0.3 * rng.standard_normal(256) for _ in range(12)]
                 + [b + 0.3 * rng.standard_normal(256) for _ in range(12)]
                 + [odd + 0.3 * rng.standard_normal(256) for _ in range(2)])
    w = np.array([3.0] * 24 + [0.5, 0.5])  # seconds of speech behind each piece
    labels = cluster(x, threshold=0.5, weights=w, min_weight=4.0, **bounds)
    assert _same_partition(labels[:24], np.repeat([0, 1], 12)) and len(set(labels.tolist())) == 2


def test_a_lower_bound_splits_the_voices_not_the_outlying_pieces():
    """Two close voices the threshold merges, and two short outlying pieces: with ``min_speakers=2`` the tree
    was cut at 2, and the outliers were the second speaker; now it is cut deeper until two clusters carry
    the floor's weight each, the outliers folded."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal(256)
    b = a + 1.1 * rng.standard_normal(256)  # cosine distance about 0.5 from a
    odd = -a
    x = np.stack([a + 0.2 * rng.standard_normal(256) for _ in range(12)]
                 + [b + 0.2 * rng.standard_normal(256) for _ in range(12)]
                 + [odd + 0.2 * rng.standard_normal(256) for _ in range(2)])
    w = np.array([3.0] * 24 + [0.5, 0.5])
    assert len(set(cluster(x, threshold=0.8, weights=w, min_weight=4.0).tolist())) == 1  # the cut merges them
    labels = cluster(x, threshold=0.8, weights=w, min_weight=4.0, min_speakers=2)
    assert _same_partition(labels[:24], np.repeat([0, 1], 12)) and len(set(labels.tolist())) == 2


def test_a_lower_bound_never_cuts_above_the_threshold():
    """Three outlying pieces, each under the floor but together over it: the first cut from the top with two
    clusters over the floor was the tree's top split, the two merged voices against the outliers together."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal(256)
    b = a + 1.1 * rng.standard_normal(256)
    x = np.stack([a + 0.2 * rng.standard_normal(256) for _ in range(12)]
                 + [b + 0.2 * rng.standard_normal(256) for _ in range(12)]
                 + [-a + 2.6 * rng.standard_normal(256) for _ in range(3)])  # apart at the threshold, too
    w = np.array([3.0] * 24 + [1.9] * 3)
    for bounds in ({"min_speakers": 2}, {"num_speakers": 2}):
        labels = cluster(x, threshold=0.8, weights=w, min_weight=4.0, **bounds)
        assert _same_partition(labels[:24], np.repeat([0, 1], 12)) and len(set(labels.tolist())) == 2


def test_numpy_whole_numbers_are_whole_numbers():
    """median=np.int64(5) was refused as "must be an odd number ... got np.int64(5)"; it is one, stored as int."""
    cfg = PipelineConfig(median=np.int64(5), vbx_dims=np.int32(8), batch=np.int64(4))
    assert (cfg.median, cfg.vbx_dims, cfg.batch) == (5, 8, 4) and type(cfg.median) is int


@pytest.mark.parametrize("setting", [{"piece": 0.4}, {"window": 0.4, "step": 0.4}, {"min_embed": 12.0},
                                     {"piece": 3.9, "min_embed": 3.5}])  # 3.9 s cuts 10 s into 3.33 s pieces
def test_settings_that_embed_no_piece_are_refused(setting):
    """Pieces (the window cut into round(window / piece) equal parts) shorter than min_embed hold too little
    speech for any embedding: every piece was dropped and the result was empty, without a word. Refused where
    the setting is made, so a tuning grid is refused before its first setting runs."""
    with pytest.raises(ValueError, match="no piece would be embedded"):
        PipelineConfig(**setting)
    with pytest.raises(ValueError, match="no piece would be embedded"):
        PipelineConfig.for_model(None, **setting)


def test_a_piece_longer_than_min_embed_by_the_window_s_cut_is_kept():
    """piece 7 s cuts a 10 s window into one 10 s piece: embedded with min_embed 8 s."""
    assert PipelineConfig(piece=7.0, min_embed=8.0).piece == 7.0
    assert PipelineConfig.for_model(None, piece=7.0, min_embed=8.0).piece == 7.0


def test_a_row_of_zeros_is_clustered_and_a_nan_row_refused():
    """A piece whose embedding is all zeros made scipy's cosine distance NaN, and the tree refused the whole
    recording ("The condensed distance matrix must contain only finite values")."""
    x = np.eye(4)[[0, 0, 1, 1, 1]]
    x[4] = 0.0
    labels = cluster(x, threshold=0.3)
    assert labels[:4].tolist() == [0, 0, 1, 1] or labels[:4].tolist() == [1, 1, 0, 0]
    assert cluster(x, threshold=0.3, num_speakers=2).shape == (5,)
    x[4, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        cluster(x, threshold=0.3)
