"""Sounds that are not speech: long stretches of them inside conversations, and recordings of nothing else.

The segmentation model hears log-mel features minus the recording's mean. In
the conversations it learned from, "not speech" is a short pause (median
0.35 s) under the steady background: so a long stretch of steady noise (a fan,
a hum, music, typing between two turns) or a recording of noise alone, which
its own mean makes look like any other recording, was called speech. These
recordings teach it otherwise:

* ``insert_stretch``: a pause of 3-12 s opened between two turns of a
  conversation (every later turn moves by its length), and ``sound`` fills it
  and a little beyond with one sound at 3 to 25 dB below the speech;
* ``alone``: 20-45 s of one to three sounds after one another, at -65 to
  -15 dBFS, sometimes through a telephone channel; its reference is empty.

The sounds: white, pink and brown noise, music on hold (when its package is
installed), mains hum (50 or 60 Hz and its harmonics, over a little noise)
and typing (clicks at 3-8 per second).
"""
from __future__ import annotations

import numpy as np

from ..._checks import BadValue
from ..io.rttm import Turn
from . import augment as aug

KINDS = ("white", "pink", "brown", "music", "hum", "typing")
STRETCH = (3.0, 12.0)  # seconds of the inserted pause
STRETCH_SNR_DB = (3.0, 25.0)  # the sound's power below the speech's (as the background noise: 3-30 dB)
ALONE_SECONDS = (20.0, 45.0)
ALONE_DBFS = (-65.0, -15.0)  # rms level of each sound of a recording of nothing else


def kinds(sample_rate: int = 8000) -> tuple[str, ...]:
    """The sound kinds available here (music needs its Debian package)."""
    from .prompts import music

    return KINDS if music(sample_rate) else tuple(k for k in KINDS if k != "music")


def _draw_kind(rng: np.random.Generator, sample_rate: int) -> str:
    """One of the available kinds, each as likely."""
    available = kinds(sample_rate)
    return available[int(rng.integers(len(available)))]


def sound(kind: str, n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """``n`` samples of a sound of ``kind`` (one of ``KINDS``), unit power."""
    if kind in ("white", "pink", "brown"):
        return aug.colored_noise(kind, n, rng)
    if kind == "music":
        from .prompts import music

        tracks = music(sample_rate)
        if not tracks:
            raise BadValue("music needs asterisk-moh-opsound-wav (apt-get install asterisk-moh-opsound-wav; in a "
                           "checkout `make system-deps`)")
        return aug.music(list(tracks), n, rng)
    t = np.arange(n) / sample_rate
    if kind == "hum":
        mains = float(rng.choice([50.0, 60.0]))
        x = sum(rng.uniform(0.2, 1.0) / k * np.sin(2 * np.pi * mains * k * t + rng.uniform(0, 2 * np.pi))
                for k in range(1, int(sample_rate / 2 / mains)))
        x = x + 0.05 * aug.colored_noise("pink", n, rng)
    elif kind == "typing":
        x = 0.01 * aug.colored_noise("white", n, rng)
        click = int(0.012 * sample_rate)
        decay = np.exp(-np.arange(click) / (0.002 * sample_rate))
        for at in np.cumsum(rng.exponential(1.0 / rng.uniform(3.0, 8.0), size=int(n / sample_rate * 10) + 1)):
            a = int(at * sample_rate)
            if a >= n:
                break
            m = min(click, n - a)
            x[a : a + m] += rng.uniform(0.3, 1.0) * rng.standard_normal(m) * decay[:m]
    else:
        raise BadValue(f"sound must be one of {', '.join(KINDS)}, got {kind!r}")
    x = np.asarray(x, np.float64)
    return (x / (np.sqrt(np.mean(x**2)) + 1e-12)).astype(np.float32)


def _fade(x: np.ndarray, sample_rate: int, seconds: float = 0.05) -> np.ndarray:
    m = min(int(seconds * sample_rate), x.size // 2)
    if m:
        ramp = np.linspace(0.0, 1.0, m, dtype=np.float32)
        x[:m] *= ramp
        x[-m:] *= ramp[::-1]
    return x


def insert_stretch(tracks: list[np.ndarray], turns: list[Turn], sample_rate: int,
                   rng: np.random.Generator) -> tuple[list[np.ndarray], list[Turn], tuple[int, int]]:
    """A pause of ``STRETCH`` seconds opened where nobody speaks (between two turns, or at the end): the
    tracks with zeros there, the turns moved, and the pause's ``(start, end)`` in samples."""
    n = max(len(x) for x in tracks)
    busy = np.zeros(n + 1, bool)
    for t in turns:
        busy[int(t.start * sample_rate) : int((t.start + t.duration) * sample_rate)] = True
    quiet = np.flatnonzero(~busy[1:] & busy[:-1]) + 1  # the first silent sample after each stretch of speech
    at = int(quiet[int(rng.integers(quiet.size))]) if quiet.size else n
    length = int(rng.uniform(*STRETCH) * sample_rate)
    shift = length / sample_rate
    tracks = [np.concatenate([x[:at], np.zeros(length, np.float32), x[at:]]) for x in tracks]
    moved = [Turn(t.uri, round(t.start + shift, 3) if t.start * sample_rate >= at else t.start, t.duration,
                  t.speaker) for t in turns]
    return tracks, moved, (at, at + length)


def add_sound(mix: np.ndarray, span: tuple[int, int], sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """``mix`` with a sound over ``span`` (and up to 1 s either side), ``STRETCH_SNR_DB`` below the speech."""
    speech = float(np.mean(mix**2)) or 1e-8
    a = max(0, span[0] - int(rng.uniform(0.0, 1.0) * sample_rate))
    b = min(mix.size, span[1] + int(rng.uniform(0.0, 1.0) * sample_rate))
    kind = _draw_kind(rng, sample_rate)
    x = sound(kind, b - a, rng, sample_rate) * np.sqrt(speech / 10 ** (rng.uniform(*STRETCH_SNR_DB) / 10))
    out = mix.copy()
    out[a:b] += _fade(x.astype(np.float32), sample_rate)
    return out


def alone(index: int, seed: int, split_index: int, sample_rate: int, telephone_p: float = 0.2) -> np.ndarray:
    """Recording ``index``: ``ALONE_SECONDS`` of one to three sounds after one another, nobody speaking."""
    rng = np.random.default_rng([seed, index, split_index, 3])
    n = int(rng.uniform(*ALONE_SECONDS) * sample_rate)
    cuts = np.sort(rng.integers(1, n, size=int(rng.integers(0, 3))))
    out = np.zeros(n, np.float32)
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, n]):
        kind = _draw_kind(rng, sample_rate)
        level = 10 ** (rng.uniform(*ALONE_DBFS) / 20)
        out[a:b] += _fade(sound(kind, int(b - a), rng, sample_rate) * level, sample_rate, 0.2)
    if rng.random() < telephone_p:
        out = aug.telephone(out, sample_rate)
    return np.clip(out, -1.0, 1.0)
