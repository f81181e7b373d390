"""Audio loading and EEND features: log-mel, mean normalization, splicing, subsampling.

Defaults follow EEND (Fujita et al. 2019; DIARIZATION.md): 8 kHz audio, 25 ms
frames every 10 ms (200/80 samples, FFT 256, Hann window), 23 log10-mel bands,
minus the recording mean, spliced +-7 frames (345 dims), every 10th frame
kept: one output frame per 100 ms.
"""
from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import BadValue


class AudioError(BadValue):
    """An audio file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class FeatureConfig:
    sample_rate: int = 8000  # audio is resampled to this
    win: int = 200  # 25 ms frame
    hop: int = 80  # 10 ms step
    n_fft: int = 256
    n_mels: int = 23
    context: int = 7  # frames spliced on each side
    subsample: int = 10  # keep every 10th frame: 100 ms output frames

    @property
    def frame_seconds(self) -> float:
        """Duration of one output frame."""
        return self.hop * self.subsample / self.sample_rate

    @property
    def dim(self) -> int:
        return (2 * self.context + 1) * self.n_mels


def load_audio(path: str | pathlib.Path, sample_rate: int = 8000) -> torch.Tensor:
    """Mono float32 samples at ``sample_rate`` from a WAV/FLAC file of any rate and channel count."""
    import soundfile as sf
    from scipy.signal import resample_poly

    path = pathlib.Path(path)
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)  # samples, channels
    except Exception as e:  # noqa: BLE001 - libsndfile raises several types
        raise AudioError(f"{path}: cannot read audio ({e})") from None
    if data.shape[0] == 0:
        raise AudioError(f"{path}: no audio samples")
    mono = data.mean(axis=1)  # stereo -> mono
    if sr != sample_rate:
        g = math.gcd(sr, sample_rate)
        mono = resample_poly(mono, sample_rate // g, sr // g).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(mono))


def mel_filterbank(n_mels: int, n_fft: int, sample_rate: int) -> torch.Tensor:
    """Triangular filters on the HTK mel scale, ``(n_mels, n_fft // 2 + 1)``."""

    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = hz(np.linspace(mel(0.0), mel(sample_rate / 2), n_mels + 2))
    fb = np.zeros((n_mels, len(freqs)), dtype=np.float32)
    for i in range(n_mels):
        lo, mid, hi = edges[i], edges[i + 1], edges[i + 2]
        rise = (freqs - lo) / (mid - lo)
        fall = (hi - freqs) / (hi - mid)
        fb[i] = np.clip(np.minimum(rise, fall), 0.0, None)
    return torch.from_numpy(fb)


def logmel(wave: torch.Tensor, cfg: FeatureConfig = FeatureConfig()) -> torch.Tensor:
    """log10 mel power, ``(frames, n_mels)``; a signal shorter than one frame gives 0 frames."""
    if wave.numel() < cfg.win:
        return torch.zeros(0, cfg.n_mels)
    window = torch.hann_window(cfg.win, periodic=True)
    spec = torch.stft(wave, cfg.n_fft, hop_length=cfg.hop, win_length=cfg.win, window=window, center=False,
                      return_complex=True)  # F, frames
    power = spec.abs().pow(2).T  # frames, F
    return torch.log10((power @ mel_filterbank(cfg.n_mels, cfg.n_fft, cfg.sample_rate).T).clamp_min(1e-10))


def splice(feats: torch.Tensor, context: int) -> torch.Tensor:
    """Stack each frame with ``context`` neighbours on each side (edges repeated): ``(T, (2c+1) D)``."""
    if feats.shape[0] == 0:
        return feats.new_zeros(0, (2 * context + 1) * feats.shape[1])
    if context == 0:
        return feats
    padded = torch.cat([feats[:1].expand(context, -1), feats, feats[-1:].expand(context, -1)])  # T+2c, D
    return torch.cat([padded[i : i + feats.shape[0]] for i in range(2 * context + 1)], dim=1)  # T, (2c+1)D


def extract(wave: torch.Tensor, cfg: FeatureConfig = FeatureConfig()) -> torch.Tensor:
    """EEND input features ``(T_out, cfg.dim)``, one row per ``cfg.frame_seconds``."""
    f = logmel(wave, cfg)  # frames, n_mels
    f = f - f.mean(dim=0, keepdim=True) if f.shape[0] else f  # recording mean removed
    return splice(f, cfg.context)[:: cfg.subsample]  # T_out, (2c+1) n_mels
