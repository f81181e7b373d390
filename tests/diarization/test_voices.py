"""Base voices (disjoint splits, every synthesizer speaks) and the perturbations (they change audio, not time)."""
import shutil

import numpy as np
import pytest

from normlab.diarization.data import augment as aug
from normlab.diarization.data.voices import PERSONS, RECORDED, Voice, available, synthesize, voices

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng not installed (make system-deps)")
SR = 8000


def test_recorded_persons_are_split_disjointly():
    splits = list(PERSONS.values())
    assert all(not set(a) & set(b) for i, a in enumerate(splits) for b in splits[i + 1 :])
    assert {v.person for v in RECORDED} == set().union(*splits)  # every recorded voice belongs to a split


@needs_espeak
def test_voice_splits_share_no_voice_and_no_person():
    pools = {s: voices(s, "all") for s in ("train", "dev", "test")}
    keys = {s: {v.key for v in p} for s, p in pools.items()}
    persons = {s: {v.person for v in p} for s, p in pools.items()}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not keys[a] & keys[b] and not persons[a] & persons[b]
    assert len(pools["train"]) > 40 and len(pools["dev"]) > 20 and len(pools["test"]) > 20
    assert {v.person for v in pools["train"] if v.recorded} <= set(PERSONS["train"])
    with pytest.raises(ValueError, match="split"):
        voices("eval")
    with pytest.raises(ValueError, match="sources"):
        voices("train", "kokoro")


@pytest.mark.parametrize("voice", RECORDED + (Voice("espeak-ng", "f3", "espeak.f3", (100, 200)),), ids=lambda v: v.key)
def test_every_voice_speaks_at_the_asked_rate(voice):
    if not available(voice):
        pytest.skip(f"{voice.synth} voice {voice.name} not installed (make system-deps)")
    slow, fast = synthesize(voice, ["the people in the room said hello to the family"] * 2, 120, 0.8, SR)[:1] + \
        synthesize(voice, ["the people in the room said hello to the family"], 120, 1.25, SR)
    assert slow.dtype == np.float32 and 0.5 * SR < slow.size < 8 * SR and np.abs(slow).max() > 0.01
    assert fast.size < 0.85 * slow.size  # the rate control works
    assert np.abs(slow[:10]).max() > 1e-3 - 1e-9  # leading silence trimmed: a turn starts with speech


def _centroid(x):
    spec = np.abs(np.fft.rfft(x)) ** 2
    return float(np.sum(np.fft.rfftfreq(x.size, 1 / SR) * spec) / np.sum(spec))


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox not installed (make system-deps)")
def test_warp_scales_the_spectrum_and_keeps_the_length():
    t = np.arange(SR) / SR
    x = (np.sin(2 * np.pi * 500 * t) + 0.5 * np.sin(2 * np.pi * 1500 * t)).astype(np.float32)
    up, down = aug.warp(x, 1.15, SR), aug.warp(x, 0.87, SR)
    assert up.shape == x.shape == down.shape
    assert _centroid(up) == pytest.approx(1.15 * _centroid(x), rel=0.05)
    assert _centroid(down) == pytest.approx(0.87 * _centroid(x), rel=0.05)
    assert np.array_equal(aug.warp(x, 1.0, SR), x)
    with pytest.raises(ValueError, match="warp"):
        aug.warp(x, 3.0, SR)


def test_noises_snr_telephone_and_gain():
    rng = np.random.default_rng(0)
    n = 4 * SR
    white, pink, brown = (aug.colored_noise(k, n, rng) for k in ("white", "pink", "brown"))
    for x in (white, pink, brown):
        assert np.mean(x**2) == pytest.approx(1.0, rel=1e-3)
    assert _centroid(brown) < _centroid(pink) < 0.5 * _centroid(white)
    speech = rng.standard_normal(n).astype(np.float32) * 0.1
    noisy = aug.add_noise(speech, pink, 10.0)
    assert 10 * np.log10(np.mean(speech**2) / np.mean((noisy - speech) ** 2)) == pytest.approx(10.0, abs=1e-3)
    b = aug.babble([rng.standard_normal(SR).astype(np.float32), rng.standard_normal(SR // 2).astype(np.float32)],
                   n, rng)
    assert b.shape == (n,) and np.mean(b**2) == pytest.approx(1.0, rel=1e-3)
    tel = aug.telephone(white, SR)
    spec, f = np.abs(np.fft.rfft(tel)) ** 2, np.fft.rfftfreq(n, 1 / SR)
    assert spec[f < 150].sum() < 0.01 * spec[(f > 500) & (f < 3000)].sum()  # band-limited
    assert spec[f > 3800].sum() < 0.05 * spec[(f > 500) & (f < 3000)].sum()
    assert len(np.unique(np.round(tel / np.abs(tel).max(), 6))) <= 256  # 8-bit
    assert np.abs(aug.gain(speech, -12.0)).max() == pytest.approx(10 ** (-12 / 20), rel=1e-5)
    with pytest.raises(ValueError, match="noise"):
        aug.colored_noise("blue", n, rng)


@needs_espeak
def test_every_espeak_variant_speaks_in_its_own_voice_and_splits_keep_apart():
    """The variants were named by their listed voice names (Adam, Mr_Serious); espeak-ng finds them by file name
    (adam, Mr serious) and otherwise speaks plain en without a word: 60 of 101 "voices" were the default voice,
    in the train, dev and test splits alike."""
    import hashlib
    import subprocess
    import tempfile

    def sound(v: str) -> str:
        with tempfile.NamedTemporaryFile(suffix=".wav") as f:
            subprocess.run(["espeak-ng", "-v", v, "-w", f.name, "time year people"], check=True, capture_output=True)
            return hashlib.sha256(open(f.name, "rb").read()).hexdigest()

    plain = sound("en")
    splits = {s: voices(s) for s in ("train", "dev", "test")}
    sounds = {s: {sound(f"en+{v.name}") for v in vs} for s, vs in splits.items()}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not sounds[a] & sounds[b], f"{a} and {b} share a voice"
    assert plain not in sounds["dev"] | sounds["test"]  # (train's `fast` variant only sets a speed: plain en)
    n = sum(map(len, splits.values()))
    assert n >= 95 and len(set().union(*sounds.values())) >= n - 2  # every variant its own voice, or nearly
    assert all(" " not in v.key for vs in splits.values() for v in vs)
