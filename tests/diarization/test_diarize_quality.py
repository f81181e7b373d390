"""The shipped model with the full pipeline on audio it never heard: a DER bound that random weights cannot meet.

* simulated held-out conversations (espeak-ng test voices, 1-3 speakers): needs espeak-ng (and the speaker
  encoder weights, which ship in the package); skipped with the reason otherwise;
* pyannote.audio 4.0.7's real 30 s two-speaker sample (``make sample`` puts it in the virtual environment;
  ``NORMLAB_PYANNOTE_SAMPLE`` may point to a folder with sample.wav and sample.rttm); skipped otherwise.
"""
import os
import pathlib
import shutil
import sys

import numpy as np
import pytest

from normlab.diarization import Turn, diarize
from normlab.diarization.io.rttm import read_rttm
from normlab.diarization.metrics.der import score
from normlab.diarization.models.embed import MissingWeightsError, weights_path

#: DER bounds at collar 0.25 s, regression guards set from measurements with the shipped model and its dev-chosen
#: settings (docs/diarization.md has the numbers); a model that marks everything or nothing as speech, or a broken
#: stitching, reads far above.
SIMULATED_BOUND = 0.30  # the model before: 17.41% (35.17% with GE2E embeddings): synthesizer voices, overlap-heavy
#: measured 6.98% with this model (the model before: 4.83% with CAM++ embeddings, 11.20% with the tree's labels
#: alone, before each piece moved to its nearest centroid; GE2E's settings: 4.47%); its two speakers merged: 46.39%
SAMPLE_BOUND = 0.10


def _encoder_or_skip():
    try:
        weights_path()
    except MissingWeightsError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (Debian package espeak-ng; `make test` installs it)")
    _encoder_or_skip()
    from normlab.diarization.data.simulate import SimConfig, simulate

    out = tmp_path_factory.mktemp("held_out")
    folders = []
    for n in (1, 2, 3):
        cfg = SimConfig(n_mixtures=1, n_speakers=n, split="test", seed=100 + n, min_utterances=4, max_utterances=6)
        folders.append(simulate(out / f"s{n}", cfg))
    return [pathlib.Path(f) for f in folders]


def test_shipped_model_on_simulated_held_out_conversations(held_out):
    ref, hyp = {}, {}
    for folder in held_out:
        ref.update(read_rttm(folder / "ref.rttm"))
        for wav in sorted((folder / "wav").glob("*.wav")):
            hyp[wav.stem] = diarize(wav)
    result = score(ref, hyp, collar=0.25)
    assert result.der < SIMULATED_BOUND, result.format()
    n_ref = {u: len({t.speaker for t in ts}) for u, ts in ref.items()}
    n_hyp = {u: len({t.speaker for t in ts}) for u, ts in hyp.items()}
    # measured: 1 / 2 / 2 speakers for 1 / 2 / 3 (the count errs low: docs/diarization.md); a clustering that
    # over-splits (a speaker per piece, an inverted cut) gives far more than one extra speaker per file
    assert all(1 <= n_hyp[u] <= n_ref[u] + 1 for u in ref), (n_ref, n_hyp)


def _sample_folder() -> pathlib.Path | None:
    for folder in (os.environ.get("NORMLAB_PYANNOTE_SAMPLE"), pathlib.Path(sys.prefix) / "share" / "normlab" /
                   "pyannote-sample"):
        if folder and (pathlib.Path(folder) / "sample.wav").is_file():
            return pathlib.Path(folder)
    return None


def test_real_speech_pyannote_sample():
    folder = _sample_folder()
    if folder is None:
        pytest.skip("pyannote.audio 4.0.7's sample.wav is not here: `make sample` fetches it into the venv")
    _encoder_or_skip()
    ref = read_rttm(folder / "sample.rttm")
    hyp = {"sample": diarize(folder / "sample.wav")}
    result = score(ref, hyp, collar=0.25)
    assert result.der < SAMPLE_BOUND, result.format()
    assert len({t.speaker for t in hyp["sample"]}) >= 2


def _sample_wave_or_skip():
    """pyannote's sample as (reference, float32 samples, rate), or skip where it or the encoder is missing."""
    folder = _sample_folder()
    if folder is None:
        pytest.skip("pyannote.audio 4.0.7's sample.wav is not here: `make sample` fetches it into the venv")
    _encoder_or_skip()
    import soundfile as sf

    wave, sr = sf.read(folder / "sample.wav", dtype="float32")
    return read_rttm(folder / "sample.rttm"), wave, sr


def test_real_speech_at_a_quiet_level_reads_as_at_its_own():
    """The model's features and the speaker encoder do not hear the level; the silence gate follows a quiet
    recording. The sample 26 dB quieter (a distant microphone) reads what it reads at its own level; with the
    fixed -70 dBFS gate its quiet speech was silenced (5.69% became 9.00% at -20 dB, 62.73% at -34 dB)."""
    ref, wave, sr = _sample_wave_or_skip()
    own = score(ref, {"sample": diarize(wave, sample_rate=sr)}, collar=0.25).der
    quiet = score(ref, {"sample": diarize(wave * 0.05, sample_rate=sr)}, collar=0.25).der
    assert abs(quiet - own) < 0.01, (own, quiet)


def test_real_speech_as_real_recordings_store_it():
    """The recording as it was stored does not decide the speakers: the sample with a DC offset of 0.02 full
    scale (a cheap sound card), with 50 Hz mains hum and its third harmonic at -35 dBFS, or followed by 20 s of
    a fan (white noise at -40 dBFS), reads within a few points of the sample as it is. Before the reader
    removed offsets and hum, the first two merged its two speakers (46.39%); before the steady-noise gate,
    the fan's 20 s were 20 s of speech."""
    ref, wave, sr = _sample_wave_or_skip()
    t = np.arange(wave.size) / sr
    hum = (10 ** (-35 / 20) * (np.sin(2 * np.pi * 50 * t) + np.sin(2 * np.pi * 150 * t) / 3)).astype(np.float32)
    fan = (0.01 * np.random.default_rng(0).standard_normal(20 * sr)).astype(np.float32)
    own = score(ref, {"sample": diarize(wave, sample_rate=sr)}, collar=0.25).der
    for name, changed in (("offset", wave + np.float32(0.02)), ("hum", wave + hum)):
        der = score(ref, {"sample": diarize(changed, sample_rate=sr)}, collar=0.25).der
        assert der < own + 0.08, (name, own, der)
    turns = diarize(np.concatenate([wave, fan]), sample_rate=sr)
    assert sum(max(0.0, t.end - max(t.start, wave.size / sr)) for t in turns) < 2.0  # of the fan's 20 s


def test_real_speech_after_a_long_quiet_lead_in_reads_as_without_it():
    """A recorder's own noise before the talk starts (15 s at -100 dBFS) pulled the recording mean of the
    features toward it: the sample read 46% with one speaker (4.22% without the lead-in; 80-82% after 45 s at
    -80 to -100 dBFS). Long quiet stretches are now left out of the mean."""
    ref, wave, sr = _sample_wave_or_skip()
    own = score(ref, {"sample": diarize(wave, sample_rate=sr)}, collar=0.25).der
    lead = (1e-5 * np.random.default_rng(0).standard_normal(15 * sr)).astype(np.float32)
    later = {"sample": [Turn("sample", t.start + 15.0, t.duration, t.speaker) for t in ref["sample"]]}
    hyp = {"sample": diarize(np.concatenate([lead, wave]), sample_rate=sr)}
    assert score(later, hyp, collar=0.25).der < own + 0.02  # (speech called in the lead-in counts too)
