"""benchmarks/diarize_far_field.py --channel: each channel does to the audio what docs/diarization.md says."""

import numpy as np
import pytest

from conftest import load_benchmark

pytest.importorskip("scipy")
bench = load_benchmark("diarize_far_field")


def _band_share(y: np.ndarray, sr: int, lo: float, hi: float) -> float:
    power = np.abs(np.fft.rfft(y)) ** 2
    f = np.fft.rfftfreq(len(y), 1 / sr)
    return float(power[(f >= lo) & (f < hi)].sum() / power.sum())


def test_each_channel_does_what_it_names():
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal(16000 * 2)).astype(np.float32)  # 2 s of white noise at 16 kHz
    tel, rate = bench.channel(x, 16000, "telephone")
    assert rate == 8000 and len(tel) == len(x) // 2
    assert _band_share(tel, 8000, 300, 3400) > 0.95
    assert len(np.unique(np.round(np.abs(tel), 9))) <= 128  # 8-bit mu-law: at most 128 magnitudes
    radio, rate = bench.channel(x, 16000, "radio")
    assert rate == 16000 and np.abs(radio).max() <= 0.5 and _band_share(radio, 16000, 4500, 8000) < 0.05
    quiet, _ = bench.channel(x, 16000, "quiet")
    assert np.allclose(quiet, x * 10 ** -1.5)
    clipped, _ = bench.channel(x, 16000, "clipped")
    assert np.abs(clipped).max() == pytest.approx(0.5) and (np.abs(clipped) == 0.5).mean() > 0.05
    with pytest.raises(ValueError, match="unknown channel"):
        bench.channel(x, 16000, "satellite")
