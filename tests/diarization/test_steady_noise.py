"""The steady-noise gate (``PipelineConfig.flat_db``, ``segment.flat_frames``): a frame whose level hardly
moves over the seconds around it (a fan, hum, room tone) is never speech, whatever the model says; speech,
which rises and falls with its syllables, and the frames near it are left to the model."""
import numpy as np
import pytest
import torch

from normlab.diarization.io.audio import SAMPLE_RATE
from normlab.diarization.models.embed import SpeakerEncoder
from normlab.diarization.pipeline.config import PipelineConfig
from normlab.diarization.pipeline.segment import band_level_db, flat_frames, frame_level_db, segment


def _syllables(seconds, rng, level=0.1):
    """Noise shaped like speech: 4 syllables a second, each 60-200 ms, and pauses."""
    n = int(seconds * SAMPLE_RATE)
    env = np.zeros(n)
    for start in np.arange(0, seconds, 0.25):
        a, b = int(start * SAMPLE_RATE), int((start + rng.uniform(0.06, 0.2)) * SAMPLE_RATE)
        env[a:b] = rng.uniform(0.3, 1.0)
    return level * env * rng.standard_normal(n) + 1e-3 * rng.standard_normal(n)  # over a -60 dBFS floor


def test_flat_frames_are_steady_sound_not_speech():
    rng = np.random.default_rng(0)
    steady = 1e-3 * rng.standard_normal(20 * SAMPLE_RATE)  # white noise at -60 dBFS
    wave = torch.from_numpy(np.concatenate([_syllables(6, rng), steady]).astype(np.float32))
    hop = SAMPLE_RATE // 10
    level = frame_level_db(wave, hop, wave.numel() // hop)  # 100 ms frames
    flat = flat_frames(level, 20, 2.0)
    assert not flat[:60].any()  # speech-like: never flat
    assert not flat[60:67].any()  # up to 0.7 s past it: more than a tenth of the window holds syllables
    assert flat[72:255].all()  # the middle of the steady stretch
    assert not flat_frames(level, 20, 0.0).any()  # 0: off
    quiet = torch.from_numpy(_syllables(20, rng, level=2e-3).astype(np.float32))  # speech 4-6 dB over the floor
    assert not flat_frames(frame_level_db(quiet, hop, quiet.numel() // hop), 20, PipelineConfig.flat_db).any()
    assert flat_frames(level[:0], 20, 2.0).numel() == 0


class _HearsSpeechEverywhere(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def activity(self, x):
        return torch.full((*x.shape[:2], 2), 0.9) * torch.tensor([1.0, 0.0])


def test_a_long_steady_noise_after_speech_is_not_speech():
    rng = np.random.default_rng(1)
    wave = torch.from_numpy(np.concatenate([_syllables(5, rng), 1e-3 * rng.standard_normal(10 * SAMPLE_RATE)])
                            .astype(np.float32))
    kw = dict(window=15.0, step=15.0, threshold=0.5, speakers="eend", vad="off")
    speech = {db: (segment(_HearsSpeechEverywhere(), SpeakerEncoder(), wave, "u",
                           PipelineConfig.for_model(None, flat_db=db, **kw)).probs[0] > 0.5).any(1)
              for db in (PipelineConfig.flat_db, 0.0)}
    assert PipelineConfig.flat_db > 0  # on by default
    assert speech[PipelineConfig.flat_db][:50].all()  # the speech stays the model's
    assert not speech[PipelineConfig.flat_db][62:148].any()  # the noise, a second past the speech, is not speech
    assert speech[0.0].all()  # off: the model alone decides, and it hears speech in the noise
    with pytest.raises(ValueError, match="flat_db"):
        PipelineConfig.for_model(None, flat_db=-1.0)


def _brown(seconds, rng, level=0.05):
    """Brown (1/f^2) noise: a leaky running sum of white noise, most of its power in slow components below 50 Hz
    whose level wanders (a rumble, a far road)."""
    from scipy.signal import lfilter

    x = lfilter([1.0], [1.0, -0.999], rng.standard_normal(int(seconds * SAMPLE_RATE)))
    return level * x / np.abs(x).max()


def test_brown_noise_is_steady_above_its_rumble():
    """Over 2 s, brown noise's 100 ms broadband levels span 3.5-6 dB, beyond the 2 dB the test allows: the model
    heard it as speech throughout and nothing removed it. Above 300 Hz it is as steady as white noise, and speech
    still is not."""
    rng = np.random.default_rng(2)
    hop = SAMPLE_RATE // 10
    noise = torch.from_numpy(_brown(20, rng).astype(np.float32))
    n = noise.numel() // hop
    assert flat_frames(frame_level_db(noise, hop, n), 20, 2.0).float().mean() < 0.3  # what the test heard
    assert flat_frames(band_level_db(noise, SAMPLE_RATE, hop, n), 20, 2.0)[10:-10].all()
    speech = torch.from_numpy((_syllables(10, rng) + _brown(10, rng, level=0.01)).astype(np.float32))
    assert not flat_frames(band_level_db(speech, SAMPLE_RATE, hop, 100), 20, 2.0).any()
    wave = torch.from_numpy(np.concatenate([_syllables(5, rng), _brown(10, rng)]).astype(np.float32))
    kw = dict(window=15.0, step=15.0, threshold=0.5, speakers="eend", vad="off")
    heard = (segment(_HearsSpeechEverywhere(), SpeakerEncoder(), wave, "u",
                     PipelineConfig.for_model(None, **kw)).probs[0] > 0.5).any(1)
    assert heard[:50].all() and not heard[62:140].any()  # the speech is the model's; the rumble after it is not
