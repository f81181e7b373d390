"""The audio reader's promises about how a recording was made: a DC offset (fixed or drifting) is removed
before anything reads the signal, PCM integers are scaled as PCM, and a file name with spaces is a valid
recording name."""
import math

import numpy as np
import pytest
import soundfile as sf

from normlab.diarization.io.audio import as_mono, read_mono, recording_uri, remove_dc

SR = 16000


def _tone(freq, seconds, amp=0.2):
    t = np.arange(int(seconds * SR)) / SR
    return (amp * np.sin(2 * math.pi * freq * t)).astype(np.float32)


def _amplitude(x, freq):
    """The amplitude of ``freq`` in ``x`` (least squares on a sine and a cosine)."""
    t = np.arange(len(x)) / SR
    basis = np.stack([np.sin(2 * math.pi * freq * t), np.cos(2 * math.pi * freq * t)], 1)
    coef = np.linalg.lstsq(basis, x.astype(np.float64), rcond=None)[0]
    return float(np.hypot(*coef))


def test_a_fixed_or_drifting_offset_is_removed_and_speech_frequencies_kept(tmp_path):
    seconds = 130  # three of the reader's 60 s blocks: the filter's state crosses their edges
    t = np.arange(seconds * SR) / SR
    offset = 0.3 + 0.05 * np.sin(2 * math.pi * 0.05 * t)  # an offset that drifts (a 20 s period)
    speech_band = _tone(100, seconds) + _tone(1000, seconds, 0.1)
    sf.write(tmp_path / "offset.wav", (speech_band + offset).astype(np.float32), SR, subtype="FLOAT")
    x = read_mono(tmp_path / "offset.wav", SR).numpy()
    per_second = x[SR // 2 :][: (seconds - 1) * SR].reshape(seconds - 1, SR).mean(1)
    assert np.abs(per_second).max() < 2e-3  # from 0.25-0.35 to nothing, in every second after the first half
    assert _amplitude(x[SR:], 100) == pytest.approx(0.2, rel=0.01)  # a low voice's fundamental is kept
    assert _amplitude(x[SR:], 1000) == pytest.approx(0.1, rel=0.005)
    # a waveform given as an array is read the same way
    y, _ = as_mono((speech_band + offset).astype(np.float32), SR, SR)
    assert np.allclose(y.numpy(), x, atol=1e-5)


def test_an_offset_alone_leaves_the_signal_as_it_was():
    clean = _tone(300, 5) + 0.01 * np.random.default_rng(0).standard_normal(5 * SR).astype(np.float32)
    a = remove_dc(clean.copy(), SR)
    b = remove_dc(clean + np.float32(0.3), SR)
    assert np.abs(a - b).max() < 1e-5
    assert remove_dc(np.zeros(0, np.float32), SR).size == 0


@pytest.mark.parametrize("dtype,values,expected", [
    (np.uint8, [0, 128, 255], [-1.0, 0.0, 127 / 128]),  # unsigned PCM: 128 is silence
    (np.int16, [-32768, 0, 16384], [-1.0, 0.0, 0.5]),
    (np.int32, [-(2 ** 31), 0, 2 ** 30], [-1.0, 0.0, 0.5]),
])
def test_pcm_integers_are_scaled_as_pcm(dtype, values, expected, monkeypatch):
    import normlab.diarization.io.audio as audio

    monkeypatch.setattr(audio, "remove_dc", lambda mono, sr: mono)  # the scaling alone
    x, _ = as_mono(np.array(values * 100, dtype=dtype), SR, SR)
    assert np.allclose(x.numpy()[:3], expected, atol=1e-6)
    silence, _ = as_mono(np.full(SR, 128 if dtype == np.uint8 else 0, dtype=dtype), SR, SR)
    assert float(silence.abs().max()) == 0.0


def test_a_name_with_spaces_is_one_recording_name():
    assert recording_uri("/data/my meeting.wav") == "my_meeting"
    assert recording_uri("a \t b  c.flac") == "a_b_c"
    assert recording_uri("plain.wav") == "plain"
    assert as_mono({"waveform": np.zeros((1, SR), np.float32), "sample_rate": SR, "uri": "team call"}, None,
                   SR)[1] == "team_call"
