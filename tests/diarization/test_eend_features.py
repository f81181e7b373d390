"""Audio files (the one reader, ``io.audio.read_mono``) and EEND features (the one extractor,
``io.features.extract``)."""
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab.diarization.io.audio import AudioError, read_mono
from normlab.diarization.io.features import (
    QUIET_RUN_SECONDS,
    STEADY_DB,
    FeatureConfig,
    extract,
    logmel,
    long_pauses,
    mel_filterbank,
)


def _tone(freq, seconds, sr):
    t = np.arange(int(seconds * sr)) / sr
    return (0.5 * np.sin(2 * math.pi * freq * t)).astype(np.float32)


def test_load_resamples_and_downmixes(tmp_path):
    stereo = np.stack([_tone(440, 1.0, 16000), np.zeros(16000, np.float32)], axis=1)
    sf.write(tmp_path / "a.flac", stereo, 16000)
    x = read_mono(tmp_path / "a.flac", 8000)
    assert x.dtype == torch.float32 and abs(x.numel() - 8000) <= 1
    assert x.abs().max() == pytest.approx(0.25, rel=0.05)  # mean of the two channels


def test_bad_files_name_themselves(tmp_path):
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF not really")
    with pytest.raises(AudioError, match="corrupt.wav"):
        read_mono(tmp_path / "corrupt.wav", 8000)
    sf.write(tmp_path / "empty.wav", np.zeros((0, 1), np.float32), 8000)
    with pytest.raises(AudioError, match="empty.wav"):
        read_mono(tmp_path / "empty.wav", 8000)
    with pytest.raises(AudioError, match="missing.wav: no such file"):
        read_mono(tmp_path / "missing.wav", 8000)
    with pytest.raises(AudioError, match="a folder, not an audio file"):
        read_mono(tmp_path, 8000)


def test_mel_filterbank_shape_and_coverage():
    fb = mel_filterbank(23, 256, 8000)
    assert fb.shape == (23, 129) and (fb >= 0).all() and (fb.max(dim=1).values > 0.5).all()
    centres = fb.argmax(dim=1)
    assert torch.all(centres[1:] >= centres[:-1])  # increasing centre frequencies


def test_tone_lands_in_its_band():
    cfg = FeatureConfig()
    f = logmel(torch.from_numpy(_tone(1000, 1.0, 8000)), cfg)
    assert f.shape == (1 + (8000 - 256) // 80, 23)  # frames of n_fft samples (the 200-sample window, zero-padded)
    band = f.mean(0).argmax().item()
    fb = mel_filterbank(23, 256, 8000)
    assert fb[band, round(1000 / (8000 / 256))] > 0  # the loudest band contains 1 kHz


def test_extract_shapes_mean_and_splice():
    cfg = FeatureConfig()
    wave = torch.from_numpy(_tone(300, 3.0, 8000)) + 0.01 * torch.randn(24000)
    x = extract(wave, cfg)
    frames = 1 + (24000 - 256) // 80
    assert x.shape == (math.ceil(frames / 10), 345) and cfg.frame_seconds == pytest.approx(0.1)
    centre = x[:, 7 * 23 : 8 * 23]  # the unspliced frame sits in the middle block
    full = logmel(wave, cfg)
    torch.testing.assert_close(centre, (full - full.mean(0))[::10])
    ctx = full - full.mean(0)  # kept frames come with 7 neighbours a side, edges repeated
    rows = lambda i: x[i].reshape(15, 23)  # noqa: E731
    torch.testing.assert_close(rows(0)[:8], ctx[:1].expand(8, -1))  # the first frame: its left context is itself
    torch.testing.assert_close(rows(0)[8:], ctx[1:8])
    torch.testing.assert_close(rows(5), ctx[50 - 7 : 50 + 8])
    last = (frames - 1) // 10 * 10
    torch.testing.assert_close(rows(-1), ctx[torch.arange(last - 7, last + 8).clamp(max=frames - 1)])
    assert extract(torch.zeros(50), cfg).shape == (0, 345)
    assert extract(torch.zeros(230), cfg).shape == (0, 345)  # more than one window (200), less than one FFT (256)


def test_features_in_blocks_equal_one_block():
    """The blocked extractor (bounded memory on long recordings) gives the numbers of one block, bit for bit."""
    torch.manual_seed(0)
    w8 = torch.randn(8000 * 31 + 77)
    assert torch.equal(extract(w8, block=500), extract(w8, block=10**9))


def test_digital_silence_reads_as_the_recordings_quiet_background():
    """Seconds of exact zeros before a recording (every band at the log floor) pulled the recording mean
    towards the floor, so all of its speech read differently, and gave the model a floor it never heard: a
    2-speaker conversation read 33% DER with 2 s of zeros first, 2.4% without. Now the frames with sound read
    as without the zeros, and the silent ones as quiet background: within the range of the sound's frames."""
    cfg = FeatureConfig()
    torch.manual_seed(0)
    sound = torch.from_numpy(_tone(300, 3.0, 8000)) * torch.rand(24000) + 0.01 * torch.randn(24000)
    pad = 8000 * 2  # 2 s: 200 whole frames of zeros (80-sample hop), 20 kept frames
    x, alone = extract(torch.cat([torch.zeros(pad), sound]), cfg), extract(sound, cfg)
    centre = lambda f: f[:, 7 * 23 : 8 * 23]  # noqa: E731 - the unspliced frames
    # past the zeros (and the frame that spans the edge): as without them, but for the few frames across the edge
    # that count as sound in the mean (before: 5.1 apart, the whole recording moved by the floor)
    torch.testing.assert_close(centre(x)[21:], centre(alone)[1:], atol=0.02, rtol=0)
    quiet = centre(x)[:19]  # one background frame, below the mean in every band, far above the floor's -6 of before
    assert torch.equal(quiet, quiet[:1].expand_as(quiet)) and (quiet < 0).all() and (quiet > -2).all()
    assert torch.equal(extract(torch.zeros(24000), cfg), torch.zeros_like(extract(torch.zeros(24000), cfg)))


def _talk(seconds: float, seed: int = 0) -> torch.Tensor:
    """Syllables of a loud tone (a 3 Hz envelope: it rises and falls by tens of dB within each second, as talk
    does) in noise, with short pauses, 8 kHz: a stand-in for speech whose own pauses are louder than a
    recorder's noise floor."""
    g = torch.Generator().manual_seed(seed)
    n = int(seconds * 8000)
    t = torch.arange(n) / 8000
    on = (torch.arange(n) // 4000) % 3 != 2  # 0.5 s on, 0.5 s on, 0.5 s pause
    syllables = torch.sin(2 * math.pi * 3 * t).abs() ** 2
    return torch.from_numpy(_tone(300, seconds, 8000)) * on * syllables * 0.2 + 1e-3 * torch.randn(n, generator=g)


def _talk_moved_by(lead: torch.Tensor) -> torch.Tensor:
    """How far ``lead`` before the talk moves each unspliced talk frame's features (log10 units), the frame that
    spans the edge left out."""
    cfg = FeatureConfig()
    talk = _talk(20.0)
    x, alone = extract(torch.cat([lead, talk]), cfg), extract(talk, cfg)
    return x[lead.numel() // cfg.hop // cfg.subsample + 1 :, 7 * 23 : 8 * 23] - alone[1:, 7 * 23 : 8 * 23]


def test_a_long_quiet_lead_in_leaves_the_recording_mean_alone():
    """30 s of a recorder's own noise (-80 dBFS) before 20 s of talk pulled the recording mean toward it: every
    talk frame read about 1.5 log10 units (15 dB) louder than without the lead-in, and the shipped model found
    one speaker or four where the sample has two (46-82% DER). A quiet stretch longer than 10 s is now left
    out of the mean: the talk reads as it does alone."""
    cfg = FeatureConfig()
    lead = 1e-4 * torch.randn(30 * 8000, generator=torch.Generator().manual_seed(1))
    # (but for the frames across the edge, which count in the mean: before, 1.5 apart)
    assert _talk_moved_by(lead).abs().max() < 0.01
    talk = _talk(20.0)
    # a quiet stretch shorter than the limit counts in the mean as before: the recording mean of every frame
    short = torch.cat([lead[: 5 * 8000], talk])
    f = logmel(short, cfg)
    assert not long_pauses(f, cfg).any()
    torch.testing.assert_close(extract(short, cfg)[:, 7 * 23 : 8 * 23], (f - f.mean(0))[::10], atol=0, rtol=0)


def test_long_pauses_are_runs_of_quiet_frames_or_steady_seconds_longer_than_the_limit():
    cfg = FeatureConfig()
    per_second = cfg.sample_rate // cfg.hop
    g = torch.Generator().manual_seed(0)
    f = -2.0 - 3.0 * torch.rand(100 * per_second, 1, generator=g).expand(-1, 23)  # talk: 30 dB up and down
    f = f.clone()
    f[: 12 * per_second] = -7.0  # a 12 s quiet lead-in
    f[40 * per_second : 45 * per_second] = -6.8  # a 5 s pause, 2 dB above the quiet level: quiet, but short
    f[60 * per_second : 60 * per_second + int(QUIET_RUN_SECONDS * per_second) + 1] = -6.6  # just over the limit
    marked = long_pauses(f, cfg)
    assert marked[: 12 * per_second].all() and not marked[12 * per_second : 60 * per_second].any()
    assert marked[60 * per_second : 60 * per_second + 1001].all() and not marked[60 * per_second + 1001 :].any()
    f[60 * per_second + int(QUIET_RUN_SECONDS * per_second)] = -2.0  # now exactly the limit: not longer
    assert not long_pauses(f, cfg)[60 * per_second :].any()
    # steady seconds well above the quiet level (a fan louder than the pauses): more than 10 of them in a row
    f[70 * per_second : 81 * per_second] = -4.0 + 0.5 * STEADY_DB / 10 * torch.rand(11 * per_second, 1, generator=g)
    f[85 * per_second : 95 * per_second] = -4.0  # 10 s: not more than the limit
    marked = long_pauses(f, cfg)
    assert marked[70 * per_second : 81 * per_second].all() and not marked[81 * per_second :].any()
    assert long_pauses(torch.zeros(0, 23), cfg).shape == (0,)


def test_a_steady_lead_in_louder_than_the_pauses_leaves_the_mean_alone():
    """45 s of a fan (white noise 12 dB above the talk's own pauses) before the talk: not quiet by the
    recording's quiet level, but steady; pyannote's sample read 46% after such a lead-in (4.22% without), and
    4.22% now."""
    fan = 4e-3 * torch.randn(45 * 8000, generator=torch.Generator().manual_seed(2))
    assert _talk_moved_by(fan).abs().max() < 0.01


def test_zeros_then_a_recorders_hiss_then_talk():
    """Digital zeros first (read as the quietest frames) set the quiet level below a recorder's hiss: one hiss
    frame 0.06 dB over the quiet threshold split its 45 s run, and the 5.5 s left counted in the mean (every talk
    frame 4.2 dB louder). The hiss is steady: the whole run is left out."""
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        torch.randn(45 * 8000, generator=g)
    hiss = 1e-4 * torch.randn(45 * 8000, generator=g)
    assert abs(_talk_moved_by(torch.cat([torch.zeros(10 * 8000), hiss])).mean()) < 0.02
