"""The rules of stitching and post-processing, each on a case built for it: edges of the median filter, turn order,
local speakers of one cluster, window weighting, hold and gap filling."""
import numpy as np
import pytest
import torch

from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.postprocess import median_filter, to_turns
from normlab.diarization.pipeline.segment import Segmentation
from normlab.diarization.pipeline.stitch import stitch


def test_median_filter_repeats_the_edges():
    a = torch.tensor([[1], [1], [0], [0], [0], [0], [1], [1]], dtype=torch.uint8)
    assert median_filter(a, 5).flatten().tolist() == [1, 1, 0, 0, 0, 0, 1, 1]

def test_to_turns_are_sorted():
    p = torch.zeros(10, 2)
    p[5:, 0], p[:3, 1] = 0.9, 0.9
    turns = to_turns(p, 0.1, "u", median=1)
    assert turns == sorted(turns) and turns[0].speaker == "spk1"

def _seg(probs, pieces, starts, frames, emb, weights):
    return Segmentation("rec", frames, 0.1, starts, probs, pieces, emb, np.asarray(weights, dtype=float))

def test_local_speakers_of_one_cluster_merge_by_maximum_not_sum():
    """One window: local speakers 0 and 1 (same voice, both 0.4) and 2 (another voice, 0.6). One talks: voice 2."""
    probs = torch.zeros(1, 20, 3)
    probs[0, :, 0], probs[0, :, 1], probs[0, :, 2] = 0.4, 0.4, 0.6
    emb = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    seg = _seg(probs, [(0, 0, 0, 20, 0), (0, 1, 0, 20, 1), (0, 2, 0, 20, 2)], [0], 20, emb, [3.0, 3.0, 3.0])
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0, offset_threshold=1.0)
    turns = stitch(seg, cfg)
    assert len(turns) == 1 and (turns[0].start, turns[0].end) == pytest.approx((0.0, 2.0))
    # the voice heard at 0.6 (3 s of embeddings against the merged pair's 6 s): spk0, the one who speaks
    assert turns[0].speaker == "spk0"


def test_speakers_are_labelled_by_decreasing_speech_in_the_output():
    """Labels followed the clusters' embedding weight (seconds per piece capped): a speaker with 2 s of output could
    be spk0 beside one with 8 s."""
    probs = torch.zeros(1, 100, 2)
    probs[0, :20, 0], probs[0, 20:, 1] = 0.9, 0.9  # voice A 2 s, voice B 8 s
    emb = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    seg = _seg(probs, [(0, 0, 0, 20, 0), (0, 1, 20, 100, 1)], [0], 100, emb, [6.0, 3.0])  # A weighs more
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0, offset_threshold=1.0)
    turns = stitch(seg, cfg)
    assert [(t.speaker, round(t.start, 3), round(t.end, 3)) for t in turns] == [("spk1", 0.0, 2.0), ("spk0", 2.0, 10.0)]

def test_hamming_average_is_a_weighted_mean_of_probabilities():
    """Windows 0 (frames 0-19) and 1 (10-29): the speaker at 0.9 on frames 0-9, 0.2 on 10-19 in both windows. The
    average there is 0.2 < offset 0.3: no hold, the turn ends at 1.0 s."""
    probs = torch.zeros(2, 20, 1)
    probs[0, :10, 0], probs[0, 10:, 0], probs[1, :10, 0] = 0.9, 0.2, 0.2
    seg = _seg(probs, [(0, 0, 0, 20, 0), (1, 0, 0, 20, 0)], [0, 10], 30, torch.eye(1, 8), [3.0])
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0, weighting="hamming",
                         offset_threshold=0.3)
    turns = stitch(seg, cfg)
    assert [(round(t.start, 3), round(t.end, 3)) for t in turns] == [(0.0, 1.0)]

def test_hold_works_for_any_offset_below_1():
    """threshold 0.8, offset 0.6: the speaker at 0.9 then 0.7 is held through the 0.7 frames."""
    probs = torch.zeros(1, 20, 1)
    probs[0, :10, 0], probs[0, 10:, 0] = 0.9, 0.7
    seg = _seg(probs, [(0, 0, 0, 20, 0)], [0], 20, torch.eye(1, 8), [3.0])
    cfg = PipelineConfig(threshold=0.8, median=1, cluster_threshold=0.5, min_cluster=0.0, offset_threshold=0.6)
    assert [(round(t.start, 3), round(t.end, 3)) for t in stitch(seg, cfg)] == [(0.0, 2.0)]

def test_fill_gap_in_frames_is_not_truncated():
    """fill_gap 0.3 s at 0.1 s frames is 3 frames (0.3 / 0.1 == 2.9999999999999996): a 2-frame pause is filled."""
    probs = torch.zeros(1, 30, 1)
    probs[0, :10, 0], probs[0, 12:, 0] = 0.9, 0.9
    seg = _seg(probs, [(0, 0, 0, 30, 0)], [0], 30, torch.eye(1, 8), [3.0])
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0, offset_threshold=1.0,
                         fill_gap=0.3)
    assert [(round(t.start, 3), round(t.end, 3)) for t in stitch(seg, cfg)] == [(0.0, 3.0)]


@pytest.mark.parametrize("gap, pause_frames, filled", [(0.15, 1, True), (0.25, 2, True), (1.25, 12, True),
                                                       (0.2, 2, False), (0.1, 1, False)])
def test_fill_gap_fills_every_pause_shorter_than_it(gap, pause_frames, filled):
    """Seconds to frames by round() left 0.1 s pauses at fill_gap 0.15 (1.4999... frames) and 0.2 s ones at 0.25
    (2.5, to even: 2) unfilled; a pause as long as fill_gap is not shorter than it."""
    probs = torch.zeros(1, 40, 1)
    probs[0, :10, 0], probs[0, 10 + pause_frames:, 0] = 0.9, 0.9
    seg = _seg(probs, [(0, 0, 0, 40, 0)], [0], 40, torch.eye(1, 8), [3.0])
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0, offset_threshold=1.0,
                         fill_gap=gap)
    assert (len(stitch(seg, cfg)) == 1) == filled


def test_a_huge_speaker_count_costs_no_more_than_the_embeddings_allow():
    """num_speakers=1,000,000 made a million columns per frame (32 s and 1.8 GB for 3 s of audio): at most one
    speaker per embedding can come out of the clustering."""
    probs = torch.zeros(1, 20, 1)
    probs[0, :, 0] = 0.9
    seg = _seg(probs, [(0, 0, 0, 20, 0)], [0], 20, torch.eye(1, 8), [3.0])
    cfg = PipelineConfig(threshold=0.5, median=1, cluster_threshold=0.5, min_cluster=0.0)
    turns = stitch(seg, cfg, num_speakers=10**9)  # a billion columns of float32 per frame: 80 GB
    assert [(t.speaker, round(t.end, 3)) for t in turns] == [("spk0", 2.0)]
