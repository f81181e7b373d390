"""Perturbations that make few base voices into many speakers and clean audio into recordings.

Speaker perturbations act on one speaker's whole track and keep its length,
so the reference turns stay where they are:

* ``warp``: every frequency (formants and F0 together) scaled by ``alpha``,
  like a shorter or longer vocal tract (sox ``pitch``, duration kept).
  Combined with the synthesizer's own F0 and rate, a voice gives speakers
  with independent formant scale, pitch and tempo.

Channel perturbations act on the mixture: ``reverberate`` (a synthetic room
per speaker), ``noise`` (white, pink, brown, or babble made from other
voices) at an SNR, ``telephone`` (300-3400 Hz band and 8-bit mu-law), and
``gain``. None of them moves a turn.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from ..._checks import BadValue, Unavailable

NOISES = ("white", "pink", "brown", "babble")


def warp(track: np.ndarray, alpha: float, sample_rate: int) -> np.ndarray:
    """``track`` with its spectrum scaled by ``alpha`` (0.8-1.25), the same number of samples."""
    if not 0.5 <= alpha <= 2.0:
        raise BadValue(f"warp factor must be in [0.5, 2], got {alpha}")
    if abs(alpha - 1.0) < 1e-3 or track.size == 0:
        return track.astype(np.float32)
    sox = shutil.which("sox")
    if sox is None:
        raise Unavailable("sox is not installed (apt-get install sox; in a checkout `make system-deps`)")
    raw = ["-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-r", str(sample_rate)]
    cents = 1200 * np.log2(alpha)
    out = subprocess.run([sox, *raw, "-", *raw, "-", "pitch", f"{cents:.1f}"], input=track.astype("<f4").tobytes(),
                         capture_output=True, check=True).stdout
    y = np.frombuffer(out, dtype="<f4").astype(np.float32)
    return np.pad(y, (0, max(0, track.size - y.size)))[: track.size]  # sox may differ by a few samples


def room_impulse_response(rt60: float, sample_rate: int, rng: np.random.Generator, tail: float = 0.3) -> np.ndarray:
    """A direct path then Gaussian noise decaying by 60 dB over ``rt60`` seconds; unit energy.

    ``tail`` is the reverberant tail's amplitude against the direct path's 1:
    0.3 is a talker near the microphone; 1-2 a microphone metres away (a meeting
    room's table microphone), where the room's sound outweighs the direct path.
    """
    if rt60 <= 0:
        raise BadValue(f"rt60 must be > 0 seconds, got {rt60}")
    t = np.arange(max(1, int(rt60 * sample_rate))) / sample_rate  # at least the direct path
    h = rng.standard_normal(t.size) * 10 ** (-3 * t / rt60) * tail  # amplitude -60 dB at t = rt60
    h[0] = 1.0
    return (h / np.sqrt(np.sum(h**2))).astype(np.float32)


def reverberate(track: np.ndarray, rt60: float, sample_rate: int, rng: np.random.Generator,
                tail: float = 0.3) -> np.ndarray:
    """``track`` in a room: convolved with a fresh impulse response, cut to its own length (turns stay put)."""
    from scipy.signal import fftconvolve

    h = room_impulse_response(rt60, sample_rate, rng, tail)
    return fftconvolve(track, h)[: len(track)].astype(np.float32)


def colored_noise(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of unit-power white, pink (1/f) or brown (1/f^2) noise."""
    if kind not in ("white", "pink", "brown"):
        raise BadValue(f"noise must be white, pink or brown, got {kind!r}")
    x = rng.standard_normal(n)
    if kind != "white" and n > 1:
        spec = np.fft.rfft(x)
        f = np.arange(spec.size, dtype=np.float64)
        f[0] = f[1]
        spec /= f ** (0.5 if kind == "pink" else 1.0)
        x = np.fft.irfft(spec, n)
    return (x / (np.sqrt(np.mean(x**2)) + 1e-12)).astype(np.float32)


def babble(utterances: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of several voices talking at once: each utterance looped from a random offset; unit power."""
    x = np.zeros(n, np.float32)
    for u in utterances:
        if u.size:
            reps = int(np.ceil(n / u.size)) + 1
            start = int(rng.integers(u.size))
            x += np.tile(u, reps)[start : start + n] / (np.sqrt(np.mean(u**2)) + 1e-12)
    return x / (np.sqrt(np.mean(x**2)) + 1e-12)


def add_noise(mix: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """``mix`` plus ``noise`` scaled to ``snr_db`` below the mixture's power."""
    power = float(np.mean(mix**2)) or 1e-8
    scale = np.sqrt(power / 10 ** (snr_db / 10) / (float(np.mean(noise**2)) or 1e-8))
    return (mix + scale * noise[: mix.size]).astype(np.float32)


def music(tracks: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of one of ``tracks`` (music on hold) from a random offset, looped if short; unit power."""
    x = tracks[int(rng.integers(len(tracks)))]
    reps = int(np.ceil(n / x.size)) + 1
    start = int(rng.integers(x.size))
    y = np.tile(x, reps)[start : start + n]
    return (y / (np.sqrt(np.mean(y**2)) + 1e-12)).astype(np.float32)


def speed(x: np.ndarray, factor: float) -> np.ndarray:
    """``x`` played ``factor`` times faster (pitch and formants move with it: Kaldi's speed perturbation)."""
    from fractions import Fraction

    from scipy.signal import resample_poly

    if abs(factor - 1.0) < 1e-3:
        return x
    f = Fraction(factor).limit_denominator(50)
    return resample_poly(x, f.denominator, f.numerator).astype(np.float32)


def telephone(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """A telephone channel: 300-3400 Hz band-pass, then 8-bit mu-law (G.711-like) quantization."""
    from scipy.signal import butter, sosfilt

    sos = butter(4, [300, min(3400, 0.45 * sample_rate)], btype="bandpass", fs=sample_rate, output="sos")
    y = sosfilt(sos, x)
    peak = float(np.abs(y).max()) or 1.0
    y = y / peak
    mu = 255.0
    q = np.round((np.sign(y) * np.log1p(mu * np.abs(y)) / np.log1p(mu)) * 127) / 127  # 8 bits
    return (np.sign(q) * np.expm1(np.abs(q) * np.log1p(mu)) / mu * peak).astype(np.float32)


def gain(x: np.ndarray, peak_db: float) -> np.ndarray:
    """``x`` scaled so that its peak is at ``peak_db`` dB full scale."""
    return (x * (10 ** (peak_db / 20) / (float(np.abs(x).max()) or 1.0))).astype(np.float32)


@dataclass(frozen=True)
class Perturbation:
    """Ranges the simulation draws from, per speaker and per mixture."""

    warp: tuple[float, float] = (0.85, 1.18)  # spectral scale per speaker
    rate: tuple[float, float] = (0.8, 1.25)  # speaking rate per speaker (the synthesizer's)
    level_db: tuple[float, float] = (-6.0, 6.0)  # speaker level, dB around the others (distance to the mic)
    reverb_p: float = 0.5  # probability that a mixture is in a room
    rt60: tuple[float, float] = (0.15, 0.7)
    snr_db: tuple[float, float] = (5.0, 25.0)
    noise_p: tuple[float, float, float, float] = (0.3, 0.25, 0.15, 0.3)  # white, pink, brown, babble
    telephone_p: float = 0.2
    peak_db: tuple[float, float] = (-24.0, -1.0)
