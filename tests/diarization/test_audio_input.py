"""The audio reader's promises about how a recording was made: a DC offset (fixed or drifting) is removed
before anything reads the signal, PCM integers are scaled as PCM, and a file name with spaces is a valid
recording name."""
import math
import pathlib
import warnings

import numpy as np
import pytest
import soundfile as sf
import torch

from normlab.diarization.io.audio import as_mono, read_mono, recording_uri, remove_dc

SR = 16000


def _tone(freq, seconds, amp=0.2):
    t = np.arange(int(seconds * SR)) / SR
    return (amp * np.sin(2 * math.pi * freq * t)).astype(np.float32)


def _amplitude(x, freq, sr=SR):
    """The amplitude of ``freq`` in ``x`` (least squares on a sine and a cosine)."""
    t = np.arange(len(x)) / sr
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


def _speech_like(seconds, sr, seed=0):
    """Noise in syllables (4 a second) over a faint floor: a long-term spectrum without narrow peaks."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    env = np.repeat(rng.uniform(0, 1, int(seconds * 4) + 1) > 0.3, sr // 4)[:n]
    return (0.1 * env * rng.standard_normal(n) + 1e-3 * rng.standard_normal(n)).astype(np.float32)


def _hum(seconds, sr, f0, harmonics=(1, 3), db=-35.0):
    t = np.arange(int(seconds * sr)) / sr
    return (10 ** (db / 20) * sum(np.sin(2 * math.pi * k * f0 * t) / k for k in harmonics)).astype(np.float32)


def test_mains_hum_is_found_by_its_fundamental():
    from normlab.diarization.io.hum import find_hum

    speech = _speech_like(30, SR)
    assert find_hum(speech, SR) == []
    assert find_hum(speech + _hum(30, SR, 50), SR) == [50, 150]
    assert find_hum(speech + _hum(30, SR, 60, (1, 2, 3)), SR) == [60, 120, 180]
    assert find_hum(_speech_like(30, 8000) + _hum(30, 8000, 60, db=-25.0), 8000) == [60, 180]  # telephone rate
    # a steady tone at a multiple of the mains frequency without the fundamental is not hum
    assert find_hum(speech + _tone(180, 30, 0.02), SR) == []
    assert find_hum(speech[: SR], SR) == []  # too short to tell
    assert find_hum(speech + _hum(30, SR, 50, (1,), db=-48.0), SR) == []  # faint: about 8 dB out, left alone


def test_hum_is_notched_out_and_the_voice_kept(tmp_path):
    seconds = 130  # three of the reader's blocks: the notches' state crosses their edges
    voice = _speech_like(seconds, SR) + _tone(1000, seconds, 0.05)
    sf.write(tmp_path / "hum.wav", voice + _hum(seconds, SR, 50), SR, subtype="FLOAT")
    x = read_mono(tmp_path / "hum.wav", SR).numpy()
    hum = 10 ** (-35 / 20)
    for part in (x[2 * SR : 50 * SR], x[-50 * SR :]):  # after the notches settle; the last block too
        assert _amplitude(part, 50) < hum / 100  # 40 dB down or more
        assert _amplitude(part, 150) < hum / 3 / 100
        assert _amplitude(part, 1000) == pytest.approx(0.05, rel=0.02)
    for edge in (60, 120):  # the 2 s after each of the reader's block edges (a short window: the voice's noise
        assert _amplitude(x[edge * SR : (edge + 2) * SR], 50) < hum / 10  # is most of what it measures there)
    clean = as_mono(voice, SR, SR)[0].numpy()  # no hum: the notches never run
    assert clean.shape == voice.shape and np.allclose(clean, remove_dc(voice.copy(), SR))


@pytest.mark.parametrize("rate,f0", [(SR, 50), (SR, 60), (8000, 60), (44100, 50)])
def test_hum_is_notched_out_from_the_first_sample(rate, f0):
    """The notches started from rest: the hum faded out over the first 1.2 s, and the model heard the fade as
    speech (a turn at 0.0-0.6 s in a file of hum alone)."""
    from normlab.diarization.io.hum import remove_hum

    x = _hum(6, rate, f0, (1, 3), db=-20.0) + 1e-4 * np.random.default_rng(0).standard_normal(6 * rate).astype(
        np.float32)
    assert remove_hum(x, rate, block=rate) == [f0, 3 * f0]
    level = [float(np.sqrt(np.mean(x[i : i + rate // 10] ** 2))) for i in range(0, 6 * rate, rate // 10)]
    assert max(level) < 3 * min(level), [round(20 * math.log10(v), 1) for v in level[:15]]  # as flat as its noise


@pytest.mark.parametrize("rate", [192000, 768000])
def test_hum_is_notched_out_at_high_sample_rates(rate):
    """The notches ran in float32: their poles, within 1e-5 of the unit circle at these rates, moved off the hum
    (at 192 kHz it was lowered by 4 dB; at 768 kHz it came out 15 dB louder)."""
    from normlab.diarization.io.hum import remove_hum

    seconds = 4
    x = _speech_like(seconds, rate) + _hum(seconds, rate, 50, (1,), db=-26.0)
    assert remove_hum(x, rate, block=rate) == [50]
    assert _amplitude(x[2 * rate :], 50, rate) < 10 ** (-26 / 20) / 100  # 40 dB down or more, once settled


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_file_holding_nan_or_inf_samples_is_refused(tmp_path, bad):
    """A floating-point WAV can hold them: refused with its name, never read as silence (an empty result)."""
    x = _tone(200, 2.0)
    x[SR // 2] = bad
    path = tmp_path / "bad.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    with pytest.raises(ValueError, match="bad.wav: holds NaN or infinite samples"):
        read_mono(path, SR)


def test_samples_far_beyond_any_audio_scale_are_refused_and_the_rest_read(tmp_path):
    """A float WAV scaled by 1e20 gave an empty result (its squares overflow float32): refused with its name. Up to
    32-bit integer full scale (2^31) is read as it is; an empty waveform says so."""
    x = _tone(200, 2.0)
    for scale, ok in ((1e20, False), (2.0**31, True), (1e6, True)):
        path = tmp_path / f"s{scale:g}.wav"
        sf.write(path, (x * scale).astype(np.float32), SR, subtype="FLOAT")
        if ok:
            assert np.isfinite(read_mono(path, SR).numpy()).all()
        else:
            with pytest.raises(ValueError, match=r"s1e\+20.wav: samples reach 2e\+19, far beyond any audio scale"):
                read_mono(path, SR)
    with pytest.raises(ValueError, match="waveform: samples reach"):
        as_mono(x * 1e20, SR, SR)
    with pytest.raises(ValueError, match="waveform has no samples"):
        as_mono(np.zeros(0, np.float32), SR, SR)
    with pytest.raises(ValueError, match="waveform has no channels"):  # numpy's "zero-size array to reduction"
        as_mono(np.zeros((0, 48000), np.float32), SR, SR)


@pytest.mark.parametrize("what", ["model", "embedding"])
@pytest.mark.parametrize("value", [5, {"a": 1}, "torch.nn.Linear"])
def test_a_model_or_encoder_of_the_wrong_kind_is_named(what, value):
    """pathlib's own "expected str, bytes or os.PathLike object, not int" named neither the argument nor what
    it takes."""
    import torch

    from normlab.diarization import diarize

    value = torch.nn.Linear(2, 2) if value == "torch.nn.Linear" else value
    with pytest.raises(TypeError, match=rf"^{what} must be None .*got {type(value).__name__}$"):
        diarize(np.zeros(SR, np.float32), sample_rate=SR, **{what: value})


def test_a_model_path_of_any_path_like_kind_loads():
    """os.PathLike, not only str and pathlib (pytest's tmpdir gives py.path objects)."""
    import os

    from normlab.diarization.models.eend import SHIPPED
    from normlab.diarization.pipeline.api import load_model

    class Where(os.PathLike):
        def __fspath__(self):
            return str(SHIPPED)

    assert load_model(Where()).cfg.n_speakers >= 1


@pytest.mark.parametrize("rate", [1, 100, 999, 768001, 2_000_000_000])
def test_a_header_with_an_impossible_sample_rate_is_refused(tmp_path, rate):
    """Below 1 kHz there is no speech band; above 768 kHz a header is broken (2e9 Hz asked for gigabytes)."""
    path = tmp_path / "odd.wav"
    sf.write(path, _tone(0.1, 2.0)[: min(2 * rate + 1, 4000)], rate)
    with pytest.raises(ValueError, match=f"odd.wav: its header gives {rate} Hz; 1000 to 768000 Hz are read"):
        read_mono(path, SR)
    with pytest.raises(ValueError, match=f"sample_rate must be an integer from 1000 to 768000 Hz, got {rate}"):
        as_mono(np.zeros(4000, np.float32), rate, SR)


@pytest.mark.parametrize("kw, says", [({"uri": "a b"}, "uri must be non-empty and without spaces"),
                                      ({"uri": ""}, "uri must be non-empty"),
                                      ({"exclusive": "no"}, "exclusive must be True or False")])
def test_a_name_or_flag_the_output_cannot_hold_is_refused_before_any_work(kw, says, monkeypatch):
    """uri="a b" was accepted and failed only in .to_rttm(), after the whole recording was diarized."""
    from normlab.diarization import diarize
    from normlab.diarization.pipeline import api

    monkeypatch.setattr(api, "_diarize", lambda *a, **k: pytest.fail("diarized before checking"))
    with pytest.raises(ValueError if "uri" in kw else TypeError, match=says):
        diarize(np.zeros(SR, np.float32), sample_rate=SR, **kw)



@pytest.mark.parametrize("flag", ["exclusive", "plot", "overwrite"])
def test_diarize_files_takes_its_flags_as_true_or_false_only(flag, tmp_path, monkeypatch):
    """overwrite="no" was truthy: it replaced a reference RTTM the user had written."""
    from normlab.diarization.pipeline import api

    monkeypatch.setattr(api, "_prepare", lambda *a, **k: pytest.fail("work began before the check"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.rttm").write_text("mine\n")
    with pytest.raises(TypeError, match=f"{flag} must be True or False, got 'no'"):
        api.diarize_files([tmp_path / "a.wav"], tmp_path / "out", **{flag: "no"})
    assert (tmp_path / "out" / "a.rttm").read_text() == "mine\n"


@pytest.mark.parametrize("out_dir", [None, 3])
def test_diarize_files_takes_a_folder_s_path_as_out_dir(out_dir, tmp_path, monkeypatch):
    """None or a number was pathlib's TypeError, not normlab's one line."""
    from normlab._checks import BadType
    from normlab.diarization.pipeline import api

    monkeypatch.setattr(api, "_prepare", lambda *a, **k: pytest.fail("work began before the check"))
    with pytest.raises(BadType, match=f"out_dir must be a folder's path, got {type(out_dir).__name__}"):
        api.diarize_files([tmp_path / "a.wav"], out_dir)


@pytest.mark.parametrize("subtype", ["PCM_16", "FLOAT"])
def test_a_wav_cut_short_is_read_with_one_warning(tmp_path, subtype):
    """A copy cut at half its size was diarized as 2 s of 4 without a word (libsndfile reports what is there)."""
    import warnings

    path, cut = tmp_path / "full.wav", tmp_path / "cut.wav"
    sf.write(path, _tone(200, 4.0), SR, subtype=subtype)
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_mono(cut, SR).numel() < read_mono(path, SR).numel()
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "cut.wav: its header gives 4.0 s, the file holds 2.0 s" in said[0], said


@pytest.mark.parametrize("size", [0x7FFFF000, 0xFFFFFFFF])
def test_a_wav_written_to_a_pipe_is_not_called_cut_short(tmp_path, size):
    """A writer to a pipe cannot know the data size: sox writes 0x7FFFF000 there (read as 67108 s), others
    0xFFFFFFFF."""
    import struct
    import warnings

    path = tmp_path / "piped.wav"
    sf.write(path, _tone(200, 1.0), SR, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[at : at + 4] = struct.pack("<I", size)
    path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_mono(path, SR)
    assert not [str(w.message) for w in caught if "cut short" in str(w.message)]


def test_a_flac_whose_header_has_no_length_is_read_whole(tmp_path):
    """FLAC's STREAMINFO may leave the sample count 0, unknown (a stream's encoder cannot go back to write it):
    libsndfile then gives its largest count, soundfile's seek after the last read failed, and the file was
    refused ("Internal psf_fseek() failed"), then called cut short."""
    import warnings

    path = tmp_path / "streamed.flac"
    sf.write(path, _tone(200, 2.0), SR, format="FLAC")
    data = bytearray(path.read_bytes())
    assert data[:4] == b"fLaC"
    packed = int.from_bytes(data[18:26], "big")  # the sample rate, channels, bits and 36-bit sample count
    data[18:26] = (packed & ~((1 << 36) - 1)).to_bytes(8, "big")
    path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = read_mono(path, SR)
    assert got.numel() == 2 * SR and not [str(w.message) for w in caught if "cut short" in str(w.message)]


def test_a_cut_close_to_the_end_is_said_with_the_figures_apart(tmp_path):
    """1000 bytes short of a 6 s file read "its header gives 6.0 s, the file holds 6.0 s (cut short?)"."""
    import warnings

    path = tmp_path / "cut.wav"
    sf.write(path, _tone(200, 6.0), SR, subtype="PCM_16")
    path.write_bytes(path.read_bytes()[:-1000])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_mono(path, SR)
    said = [str(w.message) for w in caught if "cut short" in str(w.message)]
    assert len(said) == 1 and "its header gives 6.00 s, the file holds 5.97 s" in said[0], said


def test_a_file_name_that_is_not_utf8_is_read_and_named(tmp_path):
    """libsndfile was given the name as text: a Latin-1 name (bytes Python holds as surrogates) failed with
    "surrogates not allowed", and the recording's name could not be written to an RTTM."""
    import os

    sf.write(tmp_path / "plain.wav", _tone(200, 1.0), SR)
    try:
        os.rename(tmp_path / "plain.wav", os.fsencode(tmp_path) + b"/caf\xe9.wav")
    except OSError as e:
        pytest.skip(f"this file system refuses the name: {e}")
    path = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.wav")
    assert read_mono(path, SR).numel() == SR
    assert recording_uri(path) == "caf\ufffd"
    "caf\ufffd".encode("utf-8")  # writable


def test_an_empty_path_and_an_unreadable_file_say_so(tmp_path):
    import os

    from normlab.diarization.io.audio import AudioError

    with pytest.raises(AudioError, match="^an empty path names no audio file$"):
        read_mono("", SR)  # it read as ".", "a folder, not an audio file"
    if os.geteuid() == 0:
        pytest.skip("root reads any file: the permission case needs another user")
    path = tmp_path / "locked.wav"
    sf.write(path, _tone(200, 1.0), SR)
    path.chmod(0)
    with pytest.raises(AudioError, match="permission denied"):  # libsndfile said "System error."
        read_mono(path, SR)


def test_a_file_that_is_not_audio_is_named_once_and_an_empty_one_said_empty(tmp_path, monkeypatch):
    """libsndfile names the path it opened as bytes: the message read "(Error opening b'the file': ...)"."""
    from normlab.diarization.io.audio import AudioError

    monkeypatch.chdir(tmp_path)
    pathlib.Path("text.wav").write_text("hello")
    pathlib.Path("empty.wav").write_bytes(b"")
    with pytest.raises(AudioError) as e:
        read_mono("text.wav", SR)
    assert str(e.value) == "text.wav: cannot read audio (Error opening: Format not recognised.)"
    with pytest.raises(AudioError, match=r"^empty.wav: an empty file \(0 bytes\), not audio$"):
        read_mono("empty.wav", SR)


def test_audio_narrower_than_the_telephone_band_is_read_with_a_warning(tmp_path):
    """A 4 kHz file was diarized without a word, one speaker where its 8 kHz copy gave two."""
    import warnings

    sf.write(tmp_path / "lo.wav", _tone(300, 1.0)[::4], 4000)
    sf.write(tmp_path / "tel.wav", _tone(300, 1.0)[::2], 8000)
    with pytest.warns(UserWarning, match="lo.wav: 4000 Hz holds nothing above 2000 Hz"):
        assert read_mono(tmp_path / "lo.wav", SR).numel() == SR
    with pytest.warns(UserWarning, match="the waveform: 4000 Hz"):
        as_mono(_tone(300, 1.0)[::4], 4000, SR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_mono(tmp_path / "tel.wav", SR)
        as_mono(_tone(300, 1.0)[::2], 8000, SR)


def test_channels_that_cancel_in_the_mix_are_read_as_the_loudest_one(tmp_path):
    """A stereo file whose second channel is the first inverted mixed to silence: "no speech found"."""
    t = np.arange(16000) / 16000
    voice = (0.3 * np.sin(2 * math.pi * 220 * t) * np.sin(2 * math.pi * 3 * t)).astype(np.float32)
    path = tmp_path / "inverted.wav"
    sf.write(path, np.stack([0.8 * voice, -voice], axis=1), 16000, subtype="FLOAT")
    with pytest.warns(UserWarning, match=r"inverted.wav: its channels cancel when mixed to mono .* channel 2 alone"):
        mono = read_mono(path, 16000).numpy()
    assert np.corrcoef(mono, -voice)[0, 1] > 0.99 and np.abs(mono).max() > 0.25
    with pytest.warns(UserWarning, match=r"the waveform: its channels cancel .* channel 2 alone"):
        wave, _ = as_mono(np.stack([0.8 * voice, -voice]), 16000, 16000)
    assert np.corrcoef(wave.numpy(), -voice)[0, 1] > 0.99
    with warnings.catch_warnings():  # channels that add up (one louder, a little apart) are mixed as before
        warnings.simplefilter("error")
        sf.write(path, np.stack([voice, 0.5 * np.roll(voice, 40)], axis=1), 16000, subtype="FLOAT")
        mixed = read_mono(path, 16000).numpy()
    assert np.corrcoef(mixed, voice)[0, 1] > 0.9
    exact = np.stack([voice, -voice])  # cancelling exactly: no level to say ("3028 dB below them")
    with pytest.warns(UserWarning, match=r"cancel when mixed to mono \(they cancel completely: .* channel 1 alone"):
        as_mono(exact, 16000, 16000)


@pytest.mark.parametrize("n", [2, 12, 16])
def test_many_tracks_each_with_its_own_talker_are_mixed_not_cut_to_one(n):
    """N unrelated channels mix at 1/N of their mean energy: from 11 channels on, the mix read as cancelling, and
    a meeting's multitrack file was diarized from its loudest channel alone (2 s of speech out of 24)."""
    t = np.arange(8000) / 16000
    slots = np.zeros((n, n * 8000), np.float32)
    for i in range(n):  # channel i speaks in slot i only
        slots[i, i * 8000:(i + 1) * 8000] = 0.3 * np.sin(2 * math.pi * (150 + 20 * i) * t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wave, _ = as_mono(slots, 16000, 16000)
    heard = [float(np.abs(wave.numpy()[i * 8000:(i + 1) * 8000]).max()) for i in range(n)]
    assert min(heard) > 0.3 / n * 0.9  # every slot is in the mix


def _formats() -> set:
    return set(sf.available_formats())


@pytest.mark.skipif("MP3" not in _formats(), reason="this libsndfile writes no MP3")
def test_a_cut_short_compressed_file_reads_as_what_it_holds_and_says_so(tmp_path):
    """A 150 s MP3 cut to 60% of its bytes holds about 90 s; it read as 150 s, the missing minute filled with a copy
    of earlier audio (soundfile's blocks() handed a short read's buffer back whole), and nothing was said."""
    sr = 16000
    t = np.arange(10 * sr) / sr
    tones = np.concatenate([0.3 * np.sin(2 * np.pi * (200 + 100 * k) * t) for k in range(15)]).astype(np.float32)
    sf.write(tmp_path / "whole.mp3", tones, sr, format="MP3", subtype="MPEG_LAYER_III")
    data = (tmp_path / "whole.mp3").read_bytes()
    (tmp_path / "cut.mp3").write_bytes(data[: int(len(data) * 0.6)])
    with sf.SoundFile(tmp_path / "cut.mp3") as f:
        held = len(f.read())
    with pytest.warns(UserWarning, match=r"cut.mp3: its header gives 150.0 s, the file holds .* \(cut short\?\)"):
        mono = read_mono(tmp_path / "cut.mp3", sr).numpy()
    assert abs(len(mono) - held) < sr // 10 and len(mono) < 0.7 * len(tones)
    late = mono[len(mono) - 5 * sr :]  # its last seconds: the tone of that time, not one from earlier
    expected = 200 + 100 * ((len(mono) - 2.5 * sr) // (10 * sr))
    assert abs(np.argmax(np.abs(np.fft.rfft(late))) / 5 - expected) < 10


@pytest.mark.skipif("WAV" not in _formats(), reason="no WAV writer")
def test_a_gsm_wav_is_read(tmp_path):
    """GSM 6.10 in a WAV file: libsndfile decodes it but cannot seek in it, and the block reader refused it
    ("frames must be specified for non-seekable files")."""
    sr = 8000
    t = np.arange(int(4.5 * sr)) / sr
    try:
        sf.write(tmp_path / "g.wav", (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), sr, format="WAV",
                 subtype="GSM610")
    except (sf.LibsndfileError, ValueError, TypeError):
        pytest.skip("this libsndfile writes no GSM 6.10 WAV")
    mono = read_mono(tmp_path / "g.wav", 16000)
    assert abs(mono.numel() / 16000 - 4.5) < 0.1 and float(mono.abs().max()) > 0.1  # (GSM: 320-sample blocks)


def test_samples_too_quiet_to_diarize_are_said(tmp_path):
    """16-bit samples in an int32 array (``np.array`` of Python ints is int64) are read as PCM of that width,
    -96 dBFS and below, where the features' floor flattens them and the pauses read as speech: said, not silent."""
    pcm = (np.sin(np.linspace(0, 2000, 16000)) * 20000).astype(np.int16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        as_mono(pcm, 16000, 16000)  # int16: full scale, nothing to say
        as_mono(np.zeros(16000, np.float32), 16000, 16000)  # digital silence: nothing either
    for wide in (pcm.astype(np.int32), pcm.astype(np.int64), (pcm / 32768 * 1e-4).astype(np.float32)):
        with pytest.warns(UserWarning, match=r"waveform: its loudest sample is -\d+ dBFS, too quiet to diarize"):
            as_mono(wide, 16000, 16000)
    sf.write(tmp_path / "quiet.wav", pcm.astype(np.float32) / 32768 * 1e-4, 16000, subtype="FLOAT")
    with pytest.warns(UserWarning, match=r"quiet.wav: its loudest sample is -\d+ dBFS"):
        read_mono(tmp_path / "quiet.wav", 16000)


def _through_a_pipe(tmp_path, data: bytes):
    """``read_mono`` of ``data`` written into a named pipe; the warnings it gave."""
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    threading.Thread(target=lambda: fifo.write_bytes(data), daemon=True).start()
    got = []  # read in a thread of its own: a second open of the pipe (no writer left) would wait for good

    def read():
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            got.append((read_mono(fifo, SR), [str(w.message) for w in said]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert got, "reading the pipe did not end (or failed: see the thread's exception above)"
    return got[0]


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes here")
@pytest.mark.parametrize("fmt", ["WAV", "OGG"])
def test_audio_read_from_a_pipe(tmp_path, fmt):
    """`cat x.ogg | normlab diarize /dev/stdin`: a stream that does not say its length (libsndfile gives its
    largest count) was refused as "array is too big"; a pipe could not be read in blocks at all."""
    if fmt not in _formats():
        pytest.skip(f"this libsndfile writes no {fmt}")
    # (440 Hz: no harmonic of the mains; Vorbis's faint low-frequency artefacts under a pure tone in digital
    # silence stand out as hum, and a 300 Hz tone, the sixth harmonic of 50 Hz, was notched with it)
    voice = _tone(440, 2.5).astype(np.float32)
    sf.write(tmp_path / f"x.{fmt.lower()}", voice, SR, format=fmt)
    mono, said = _through_a_pipe(tmp_path, (tmp_path / f"x.{fmt.lower()}").read_bytes())
    assert abs(mono.numel() - len(voice)) < SR // 20 and float(mono.abs().max()) > 0.1 and not said


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes here")
def test_flac_from_a_pipe_says_what_to_do(tmp_path):
    """libsndfile's FLAC decoder seeks, so FLAC from a pipe failed with "flac decoder lost sync" alone."""
    import os
    import threading

    from normlab.diarization.io.audio import AudioError

    if "FLAC" not in _formats():
        pytest.skip("this libsndfile writes no FLAC")
    sf.write(tmp_path / "x.flac", _tone(440, 2.5).astype(np.float32), SR, format="FLAC")
    fifo, data = tmp_path / "pipe", (tmp_path / "x.flac").read_bytes()
    os.mkfifo(fifo)
    threading.Thread(target=lambda: fifo.write_bytes(data), daemon=True).start()
    try:
        mono = read_mono(fifo, SR)
    except AudioError as e:
        assert str(e).endswith("; FLAC cannot be read from a pipe: give the file, or pipe WAV or Ogg)"), str(e)
    else:  # a libsndfile that streams FLAC
        assert mono.numel() > 0


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes here")
def test_a_piped_wav_whose_header_does_not_know_its_length_and_channels_that_cancel(tmp_path):
    """sox and ffmpeg writing to a pipe put a placeholder length in the header: it was read as "cut short" (a
    header of 67108 s) after an array of that size was allocated; and channels that cancel, which a file is read
    again for, came back as the silent mix from a pipe, which cannot be read again."""
    import struct

    voice = _tone(300, 2.0).astype(np.float32)
    sf.write(tmp_path / "x.wav", np.stack([0.8 * voice, -voice], axis=1), SR, subtype="FLOAT")
    data = bytearray((tmp_path / "x.wav").read_bytes())
    data[4:8] = struct.pack("<I", 0xFFFFFFFF)  # what a writer that cannot seek back leaves: the largest sizes
    at = data.index(b"data")
    data[at + 4 : at + 8] = struct.pack("<I", 0xFFFFFFFF)
    mono, said = _through_a_pipe(tmp_path, bytes(data))
    assert abs(mono.numel() - len(voice)) < SR // 20 and not any("cut short" in w for w in said), said
    assert any("diarizing channel 2 alone" in w for w in said) and float(mono.abs().max()) > 0.15


@pytest.mark.parametrize("make", [
    lambda x: x.astype(np.longdouble),
    lambda x: np.asmatrix(x),
    lambda x: torch.from_numpy(x).to(torch.float8_e4m3fn),
], ids=["long double", "matrix", "float8"])
def test_a_waveform_numpy_or_torch_can_widen_is_read(make):
    """A long-double array (einsum refused it), a np.matrix (its energies "not aligned") and a float8 tensor
    (numpy has none) each stopped with a raw TypeError or ValueError."""
    from normlab.diarization.io.audio import as_mono

    x = (_tone(200, 1.0) * 0.4).astype(np.float32)
    want = as_mono(torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy() if "float8" in str(make(x).dtype)
                   else x, SR, SR)[0]
    got = as_mono(make(x), SR, SR)[0]
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda x: x.astype("timedelta64[ns]"),
    lambda x: torch.from_numpy(x).to_sparse(),
    lambda x: torch.empty(x.shape, device="meta"),
], ids=["timedelta", "sparse", "meta"])
def test_a_waveform_of_no_samples_numbers_can_hold_is_one_line(make):
    """A timedelta array (an integer to np.issubdtype: iinfo refused it), a sparse or a meta tensor: each raised
    numpy's or torch's own error."""
    from normlab._checks import BadType
    from normlab.diarization.io.audio import as_mono

    with pytest.raises(BadType, match="waveform must "):
        as_mono(make((_tone(200, 1.0) * 1000).astype(np.int64)), SR, SR)
