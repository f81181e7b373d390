"""benchmarks/diarize_count.py: the measures docs/diarization.md quotes (ROC AUC, the model's own count)."""
from types import SimpleNamespace

import numpy as np
import torch

from conftest import load_benchmark

bench = load_benchmark("diarize_count")


def test_auc_orders_and_ties():
    pos = np.array([True, True, False, False])
    assert bench.auc(np.array([3.0, 4.0, 1.0, 2.0]), pos) == 1.0
    assert bench.auc(np.array([1.0, 2.0, 3.0, 4.0]), pos) == 0.0
    assert bench.auc(np.array([1.0, 1.0, 1.0, 1.0]), pos) == 0.5  # ties count half
    assert bench.auc(np.array([2.0, 0.0, 1.0, -1.0]), pos) == 0.75  # 3 of 4 pairs in order
    assert bench.auc(np.array([1.0, 2.0]), np.array([True, True])) is None


def test_model_count_is_the_busiest_window():
    probs = torch.zeros(2, 100, 4)  # 2 windows of 100 frames of 0.1 s, 4 local speakers
    probs[0, :50, 0] = probs[0, 50:, 1] = 0.9  # window 0: two speakers of 5 s
    probs[1, :, 0] = 0.9
    probs[1, :12, 2] = 0.9  # window 1: 10 s and 1.2 s, and a third of 0.5 s
    probs[1, 20:25, 3] = 0.9
    seg = SimpleNamespace(probs=probs, frame_seconds=0.1)
    assert bench.model_count(seg, 0.5) == 2
    assert bench.model_count(seg, 0.5, least_s=0.5) == 3
    assert bench.model_count(seg, 0.95) == 0
