"""EEND features: log-mel, mean normalization, splicing, subsampling (the training data's and the pipeline's).

Defaults follow EEND (Fujita et al. 2019; docs/diarization.md): 8 kHz audio, 25 ms
frames every 10 ms (200/80 samples, FFT 256, Hann window), 23 log10-mel bands,
minus the recording mean, spliced +-7 frames (345 dims), every 10th frame
kept: one output frame per 100 ms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

#: EEND's sample rate: the features are made from 8 kHz audio (the pipeline resamples to it)
FEATURE_RATE = 8000
#: mel power below this is read as this (log10: -10): the log floor of digital silence
POWER_FLOOR = 1e-10
#: the version of what ``extract`` computes beyond ``FeatureConfig``'s numbers (2: long stretches without talk
#: left out of the recording mean); a feature cache made by another version is made again
RULES = 2
#: a stretch without talk longer than this is left out of the recording mean (``long_pauses``)
QUIET_RUN_SECONDS = 10.0
#: how far above the recording's quiet level (its frames' 5th percentile of mel power) a frame counts as quiet
QUIET_DB = 6.0
#: a second whose frames' mel power stays within this (5th to 95th percentile) is steady: noise, not talk
STEADY_DB = 6.0


@dataclass(frozen=True)
class FeatureConfig:
    sample_rate: int = FEATURE_RATE  # audio is resampled to this
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
    return torch.log10((power @ mel_filterbank(cfg.n_mels, cfg.n_fft, cfg.sample_rate).T).clamp_min(POWER_FLOOR))


def extract(wave: torch.Tensor, cfg: FeatureConfig = FeatureConfig(), block: int = 60_000) -> torch.Tensor:
    """EEND input features ``(T_out, cfg.dim)``, one row per ``cfg.frame_seconds``, in bounded memory.

    The log-mel frames are computed in blocks of ``block`` STFT frames (the
    same numbers as one call); the recording mean is removed; each kept
    frame (every ``subsample``-th) is spliced with ``context`` neighbours on
    each side (edges repeated). Only the kept frames are spliced, so the
    memory is the log-mel frames plus the output. Fewer samples than one FFT
    frame give 0 frames.
    """
    n, span = wave.numel(), max(cfg.win, cfg.n_fft)  # torch.stft frames span n_fft samples
    if n < span:
        return torch.zeros(0, cfg.dim)
    frames = 1 + (n - span) // cfg.hop
    parts = []
    for a in range(0, frames, block):
        b = min(frames, a + block)
        parts.append(logmel(wave[a * cfg.hop : (b - 1) * cfg.hop + span], cfg))  # b-a, n_mels
    f = torch.cat(parts)
    # Digital silence (every band at the log floor) reads as the recording's quiet background, its 5th
    # percentile per band: the model never heard the floor (every training mixture has noise), and a few
    # seconds of zeros at the start pulled the mean toward it (all of the speech read differently); it
    # invented speakers.
    sound = (f > torch.log10(torch.tensor(POWER_FLOOR))).any(dim=1)  # (the floor as logmel rounds it)
    if sound.any() and not sound.all():
        heard = f[sound]
        f[~sound] = heard.kthvalue(max(1, heard.shape[0] // 20), dim=0).values
    # The recording mean is that of the frames with sound, less its long stretches without talk (below)
    used = (sound if sound.any() else torch.ones_like(sound)) & ~long_pauses(f, cfg)
    if used.all() or not used.any():
        return _spliced(f - f.mean(dim=0, keepdim=True), cfg)  # the recording mean removed
    return _spliced(f - f[used].mean(dim=0, keepdim=True), cfg)


def long_pauses(f: torch.Tensor, cfg: FeatureConfig = FeatureConfig()) -> torch.Tensor:
    """Which log-mel frames of ``f`` ``(frames, n_mels)`` lie in a stretch without talk longer than
    ``QUIET_RUN_SECONDS``: frames at most ``QUIET_DB`` above the recording's quiet level (its frames' 5th
    percentile of mel power), one after another; or whole seconds, one after another, each of them steady (the
    mel power of its frames within ``STEADY_DB``, 5th to 95th percentile: talk rises and falls by tens of dB
    within a second, a fan or a recorder's hiss does not).

    Left out of the recording mean: the training recordings pause for seconds, and a long lead-in of room
    tone or of a recorder's own noise (45 s before 30 s of talk) pulled the mean toward it, so that all of the
    speech read 10-20 dB louder than the model ever heard it; it found one speaker or four where two talk.
    """
    n = f.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.bool)
    level = torch.logsumexp(f * math.log(10), dim=1) / math.log(10)  # log10 of each frame's mel power
    per_second = round(cfg.sample_rate / cfg.hop)
    longest = round(QUIET_RUN_SECONDS * per_second)
    marks = _runs_longer(level <= level.kthvalue(max(1, n // 20)).values + QUIET_DB / 10, longest)
    seconds = n // per_second
    if seconds:
        blocks = level[: seconds * per_second].reshape(seconds, per_second)
        spread = torch.quantile(blocks, 0.95, dim=1) - torch.quantile(blocks, 0.05, dim=1)  # log10 units
        steady = _runs_longer(spread < STEADY_DB / 10, round(QUIET_RUN_SECONDS))
        marks[: seconds * per_second] |= steady.repeat_interleave(per_second)
    return marks


def _runs_longer(flags: torch.Tensor, longest: int) -> torch.Tensor:
    """``flags`` kept only in runs of more than ``longest`` True values one after another."""
    edges = torch.diff(flags.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8),
                       append=torch.zeros(1, dtype=torch.int8))
    starts, ends = (edges == 1).nonzero().squeeze(1), (edges == -1).nonzero().squeeze(1)
    long = ends - starts > longest
    marks = torch.zeros(flags.shape[0] + 1, dtype=torch.int64)
    marks.index_add_(0, starts[long], torch.ones_like(starts[long]))
    marks.index_add_(0, ends[long], -torch.ones_like(ends[long]))
    return marks.cumsum(0)[:-1] > 0


def _spliced(f: torch.Tensor, cfg: FeatureConfig) -> torch.Tensor:
    """Every ``subsample``-th frame of ``f`` with its ``context`` neighbours on each side (edges repeated)."""
    frames = f.shape[0]
    centres = torch.arange(0, frames, cfg.subsample)  # T_out
    idx = (centres[:, None] + torch.arange(-cfg.context, cfg.context + 1)).clamp(0, frames - 1)  # T_out, 2c+1
    return f[idx].reshape(len(centres), -1)  # T_out, (2c+1) n_mels
