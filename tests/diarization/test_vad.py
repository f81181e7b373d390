"""Silero VAD as a normlab module: the package's numbers, frame averaging, and the gate that stops false alarms.

The weights ship in normlab (``assets/silero_vad.safetensors``); the comparison with the package's own TorchScript
model needs ``silero-vad==6.2.3`` (the ``dev`` extra) and skips without it. The chunk and context arithmetic is
tested on random weights.
"""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest
import torch

from normlab.diarization.models.vad import (
    CHUNK,
    CONTEXT,
    SAMPLE_RATE,
    MissingVADWeightsError,
    SileroVAD,
    installed_weights,
    speech_probability,
)


@pytest.fixture(scope="module")
def vad():
    try:
        installed_weights()
    except MissingVADWeightsError as e:
        pytest.skip(str(e))
    return SileroVAD.load()


def _sample_wave():
    folder = pathlib.Path(sys.prefix) / "share" / "normlab" / "pyannote-sample"
    if not (folder / "sample.wav").is_file():
        pytest.skip("the pyannote sample is not installed (`make sample`)")
    from normlab.diarization.io.audio import read_mono

    return torch.as_tensor(read_mono(folder / "sample.wav", SAMPLE_RATE)), folder / "sample.rttm"


def test_matches_the_packages_chunk_by_chunk_model(vad):
    """Batched front end + one LSTM call == the archive's TorchScript model fed 512 samples at a time."""
    if importlib.util.find_spec("silero_vad") is None:
        pytest.skip("silero_vad is not importable")
    from silero_vad.utils_vad import init_jit_model

    from normlab.diarization.models.vad import ARCHIVE
    from normlab.diarization.models.weights import installed_file

    jit = init_jit_model(str(installed_file("silero-vad", ARCHIVE)))
    rng = np.random.default_rng(0)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    wave = torch.from_numpy((0.2 * np.sin(2 * np.pi * 150 * t) * (t % 1 < 0.6) +
                             0.01 * rng.standard_normal(t.size)).astype(np.float32))
    wave = wave[: wave.numel() - 100]  # not a whole number of chunks: the last one is zero-padded
    ours = vad(wave, block=7)  # several blocks: the LSTM state must carry across them
    ref = []
    for i in range(0, wave.numel(), CHUNK):
        c = torch.nn.functional.pad(wave[i : i + CHUNK], (0, max(0, i + CHUNK - wave.numel())))
        with torch.no_grad():
            ref.append(float(jit(c[None], SAMPLE_RATE)))
    assert ours.shape == (len(ref),)
    torch.testing.assert_close(ours, torch.tensor(ref), atol=1e-5, rtol=0)


def test_speech_and_silence_on_real_speech(vad):
    wave, rttm = _sample_wave()
    from normlab.diarization.io.rttm import read_rttm

    p = speech_probability(vad, wave, frames=300, frame_seconds=0.1)
    ref = torch.zeros(300, dtype=torch.bool)
    for t in read_rttm(rttm)["sample"]:
        ref[round(t.start * 10) : round(t.end * 10)] = True
    agree = ((p > 0.5) == ref).float().mean()
    assert agree > 0.9, float(agree)
    assert float(vad(torch.zeros(SAMPLE_RATE)).max()) < 0.1  # digital silence


def test_frame_averaging_weights_the_overlap():
    class Steps(torch.nn.Module):  # 32 ms probabilities 0, 1, 0, 1, ...
        def forward(self, wave):
            n = -(-wave.numel() // CHUNK)
            return (torch.arange(n) % 2).float()

    wave = torch.zeros(CHUNK * 10)
    p = speech_probability(Steps(), wave, frames=2, frame_seconds=0.16)  # 5 chunks of 32 ms per frame
    torch.testing.assert_close(p, torch.tensor([2 / 5, 3 / 5]))
    one = speech_probability(Steps(), wave, frames=1, frame_seconds=0.032 * 2)  # chunks 0 and 1
    torch.testing.assert_close(one, torch.tensor([0.5]))


def test_the_gate_silences_noise_the_model_calls_speech(vad):
    from normlab.diarization import diarize
    from normlab.diarization.models.embed import MissingWeightsError, weights_path

    try:
        weights_path()
    except MissingWeightsError as e:
        pytest.skip(str(e))
    noise = (0.03 * np.random.default_rng(0).standard_normal(SAMPLE_RATE * 20)).astype(np.float32)
    assert diarize(noise, sample_rate=SAMPLE_RATE, vad="off", flat_db=0.0)  # the model alone: a false alarm
    assert diarize(noise, sample_rate=SAMPLE_RATE, vad="gate") == []  # the gate: nothing


def test_missing_weights_name_the_file_and_the_fix(monkeypatch, tmp_path):
    from normlab.diarization.models import weights

    monkeypatch.setattr(weights, "ASSETS", tmp_path)
    with pytest.raises(MissingVADWeightsError,
                       match=r"silero_vad.safetensors is missing .*pip install --force-reinstall"):
        installed_weights()


def test_cli_options_reach_the_pipeline(vad, tmp_path, capsys):
    """`--vad off`, `--flat-db` and `--local-speakers` are passed through: noise gives turns only without the
    gates (the VAD's, and the steady-noise gate's)."""
    import soundfile as sf

    from normlab.cli import main
    from normlab.diarization.io.rttm import read_rttm
    from normlab.diarization.models.embed import MissingWeightsError, weights_path

    try:
        weights_path()
    except MissingWeightsError as e:
        pytest.skip(str(e))
    noise = (0.03 * np.random.default_rng(1).standard_normal(SAMPLE_RATE * 12)).astype(np.float32)
    sf.write(tmp_path / "noise.wav", noise, SAMPLE_RATE)
    runs = ((["--vad", "gate", "--flat-db", "0"], "gated"), (["--vad", "off"], "steady"),
            (["--vad", "off", "--flat-db", "0"], "open"),
            (["--vad", "off", "--flat-db", "0", "--local-speakers", "eend"], "eend"))
    for extra, out in runs:
        assert main(["diarize", str(tmp_path / "noise.wav"), "--out", str(tmp_path / out), *extra]) == 0
    capsys.readouterr()
    assert read_rttm(tmp_path / "gated" / "noise.rttm") == {}
    assert read_rttm(tmp_path / "steady" / "noise.rttm") == {}  # white noise: steady, never speech by default
    assert read_rttm(tmp_path / "open" / "noise.rttm")["noise"]
    assert read_rttm(tmp_path / "eend" / "noise.rttm")["noise"]
    assert main(["diarize", str(tmp_path / "noise.wav"), "--vad", "loud"]) == 2  # argparse: one line, exit 2
    assert "invalid choice" in capsys.readouterr().err


def test_each_chunk_sees_the_previous_64_samples_and_nothing_later():
    """Random weights, no package: with the LSTM made memoryless (no recurrent weights, forget gate shut), the
    probability of chunk k depends on samples [512 k - 64, 512 k + 512) and on no other sample."""
    torch.manual_seed(0)
    vad = SileroVAD().eval()
    with torch.no_grad():
        vad.lstm.weight_hh_l0.zero_()
        vad.lstm.bias_ih_l0[128:256] = -1e4  # gates i, f, g, o: f = 0, so no cell state carries over
    wave = 0.1 * torch.randn(CHUNK * 6)
    base = vad(wave, block=2)
    assert base.shape == (6,)

    def changed(i: int) -> list[int]:
        w = wave.clone()
        w[i] += 1.0
        return (vad(w, block=2) - base).abs().gt(1e-7).nonzero().squeeze(1).tolist()

    k = 3
    assert changed(k * CHUNK - CONTEXT) == [k - 1, k]  # the first context sample: chunk k-1's, and chunk k's context
    assert changed(k * CHUNK - 1) == [k - 1, k]
    assert changed(k * CHUNK - CONTEXT - 1) == [k - 1]  # just before the context: chunk k never sees it
    assert changed(k * CHUNK) == [k]  # chunk k's first sample: no earlier chunk looks ahead
    assert changed((k + 1) * CHUNK - 1 - CONTEXT) == [k]
    assert changed(0) == [0]


def test_union_raises_the_likeliest_local_speaker_where_the_vad_hears_speech():
    from normlab.diarization.pipeline.segment import vad_union

    probs = torch.tensor([[[0.1, 0.2], [0.7, 0.6], [0.05, 0.3], [0.0, 0.0]]])  # 1 window, 4 frames, 2 speakers
    speech = torch.tensor([[[0.9], [0.65], [0.4], [0.0]]])
    got = vad_union(probs, speech, 0.5)
    want = torch.tensor([[[0.1, 0.9],  # the VAD's speech goes to the likelier speaker; the other is the model's
                          [0.7, 0.6],  # the model is surer than the VAD: unchanged (overlap kept)
                          [0.05, 0.3],  # the VAD below its threshold adds nothing
                          [0.0, 0.0]]])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(probs, torch.tensor([[[0.1, 0.2], [0.7, 0.6], [0.05, 0.3], [0.0, 0.0]]]))


def test_union_hears_speech_the_model_misses_and_keeps_what_the_vad_misses():
    from normlab.diarization.models.embed import SpeakerEncoder
    from normlab.diarization.pipeline.config import PipelineConfig
    from normlab.diarization.pipeline.segment import segment

    class Model(torch.nn.Module):  # hears speech in the first 4 s only
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def activity(self, x):
            out = torch.zeros(*x.shape[:2], 2)
            out[:, :40, 0] = 0.9
            return out

    class SecondHalf(torch.nn.Module):  # the VAD hears speech from 5 s on
        def forward(self, wave):
            n = -(-wave.numel() // CHUNK)
            return (torch.arange(n) * CHUNK >= 5 * SAMPLE_RATE).float()

    wave = 0.1 * torch.sin(torch.arange(10 * SAMPLE_RATE) * 0.05)
    kw = dict(window=10.0, step=10.0, threshold=0.5, flat_db=0.0)  # a steady sine: the VAD's gates alone
    speech = {}
    for mode in ("off", "union", "gate"):
        cfg = PipelineConfig(vad=mode, speakers="eend", **kw)
        speech[mode] = (segment(Model(), SpeakerEncoder(), wave, "u", cfg, vad=SecondHalf()).probs[0] > 0.5).any(1)
    assert speech["off"][:40].all() and not speech["off"][40:].any()
    assert speech["union"][:40].all() and not speech["union"][40:50].any() and speech["union"][50:].all()
    assert not speech["gate"].any()  # the gate keeps only where both hear speech: nowhere here


def test_veto_silences_only_long_runs_of_the_vads_non_speech():
    """vad "veto": the model decides speech, except inside runs of at least veto_seconds where the VAD hears none
    (a pause with a fan in it); the VAD's short gaps between words change nothing."""
    from normlab.diarization.models.embed import SpeakerEncoder
    from normlab.diarization.pipeline.config import PipelineConfig
    from normlab.diarization.pipeline.segment import long_runs, segment

    assert long_runs(torch.tensor([1, 1, 0, 1, 1, 1, 0, 1], dtype=torch.bool), 3).tolist() == \
        [False, False, False, True, True, True, False, False]

    class Model(torch.nn.Module):  # hears speech everywhere
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def activity(self, x):
            return torch.full((*x.shape[:2], 2), 0.9) * torch.tensor([1.0, 0.0])

    class Vad(torch.nn.Module):  # speech in 0-1 s and 6-7 s: quiet runs of 5 s and 3 s
        def forward(self, wave):
            t = torch.arange(-(-wave.numel() // CHUNK)) * CHUNK / SAMPLE_RATE
            return (((t >= 0) & (t < 1)) | ((t >= 6) & (t < 7))).float()

    wave = 0.1 * torch.sin(torch.arange(10 * SAMPLE_RATE) * 0.05)
    kw = dict(window=10.0, step=10.0, threshold=0.5, speakers="eend", vad="veto", flat_db=0.0)  # a steady sine
    speech = {s: (segment(Model(), SpeakerEncoder(), wave, "u", PipelineConfig(veto_seconds=s, **kw), vad=Vad())
                  .probs[0] > 0.5).any(1) for s in (4.0, 2.0)}
    assert speech[4.0][:10].all() and not speech[4.0][11:59].any() and speech[4.0][61:].all()
    assert speech[2.0][:10].all() and not speech[2.0][11:59].any() and speech[2.0][61:69].all() \
        and not speech[2.0][71:].any()
    with pytest.raises(ValueError, match="veto_seconds"):
        PipelineConfig.for_model(None, veto_seconds=0.0)
