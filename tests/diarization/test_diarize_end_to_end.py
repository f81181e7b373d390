"""End to end on a trivially separable mixture: audio -> features -> model -> RTTM -> DER near 0.

Through the public API (``normlab.diarization.diarize_files``) with one window over the whole recording, so
the model's own two speakers are the answer whatever the (random-weight) speaker encoder says."""
import numpy as np
import pytest
import soundfile as sf
import torch

from normlab.diarization import (
    EENDModel,
    ModelConfig,
    TrainConfig,
    Turn,
    diarization_error_rate,
    diarize_files,
    read_rttm,
    train,
)
from normlab.diarization.io.features import FeatureConfig, extract
from normlab.diarization.metrics.evaluate import frame_probs
from normlab.diarization.models.embed import SpeakerEncoder

SR, CFG = 8000, FeatureConfig()
PITCH = (220.0, 1500.0)  # two "voices" far apart in frequency


def _mixture(rng: np.random.Generator, seconds: float = 12.0):
    """Alternating turns of two tone voices, no overlap, silences between; returns audio and turns."""
    audio = 0.003 * rng.standard_normal(int(seconds * SR)).astype(np.float32)
    turns, t, k = [], rng.uniform(0.2, 1.0), int(rng.integers(2))
    while t < seconds - 1.0:
        d = min(rng.uniform(0.8, 2.5), seconds - t)
        i0, i1 = int(t * SR), int((t + d) * SR)
        tt = np.arange(i1 - i0) / SR
        f = PITCH[k] * (1 + 0.05 * rng.standard_normal())
        audio[i0:i1] += 0.3 * (np.sin(2 * np.pi * f * tt) + 0.5 * np.sin(4 * np.pi * f * tt))
        turns.append((t, t + d, f"v{k}"))
        t += d + rng.uniform(0.2, 1.0)
        k = 1 - k
    return audio, turns


def _labels(turns, frames):
    y = torch.zeros(frames, 2)
    for s, e, spk in turns:
        y[int(s / CFG.frame_seconds) : int(e / CFG.frame_seconds), int(spk[1])] = 1
    return y


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    rng = np.random.default_rng(0)
    data = []
    for _ in range(24):
        audio, turns = _mixture(rng)
        f = extract(torch.from_numpy(audio), CFG)
        data.append((f, _labels(turns, f.shape[0])))

    def batches(gen):
        idx = torch.randint(len(data), (8,), generator=gen).tolist()
        t = min(data[i][0].shape[0] for i in idx)
        return (torch.stack([data[i][0][:t] for i in idx]), torch.stack([data[i][1][:t] for i in idx]), None)

    torch.manual_seed(0)
    model = EENDModel(ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0))
    losses = train(model, batches, TrainConfig(steps=150, lr=3e-3, warmup=20, ckpt_every=50),
                   tmp_path_factory.mktemp("ckpt"))
    return model, losses


def test_separable_mixture_scores_near_zero_der(trained, tmp_path):
    model, losses = trained
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    audio, turns = _mixture(np.random.default_rng(123))  # unseen mixture
    sf.write(tmp_path / "meeting.wav", audio, SR)
    (tmp_path / "broken.wav").write_bytes(b"not audio")
    torch.manual_seed(0)
    seen = []  # each file reported once done (counted from 0): it was reported before its work began
    written = tmp_path / "out" / "meeting.rttm"
    status = diarize_files([str(tmp_path / "broken.wav"), str(tmp_path / "meeting.wav")], tmp_path / "out",
                           model=model, embedding=SpeakerEncoder(), num_speakers=2, speakers="eend", vad="off",
                           window=30.0, step=30.0, flat_db=0.0,  # its synthetic voices hold a steady level
                           progress=lambda i, n, name: seen.append((i, n, written.exists())))
    assert status[str(tmp_path / "meeting.wav")] == "ok" and "broken.wav" in status[str(tmp_path / "broken.wav")]
    assert seen == [(0, 2, False), (1, 2, True)]
    hyp = read_rttm(tmp_path / "out" / "meeting.rttm")["meeting"]
    ref = [Turn("meeting", s, e - s, spk) for s, e, spk in turns]
    result = diarization_error_rate(ref, hyp, collar=0.25)
    assert result.der < 0.05, result.format()


def test_chunked_inference_matches_whole(trained):
    model, _ = trained
    audio, _ = _mixture(np.random.default_rng(5), seconds=30.0)
    f = extract(torch.from_numpy(audio), CFG)
    whole = frame_probs(model, f, chunk_frames=10_000)
    chunked = frame_probs(model, f, chunk_frames=120, overlap_frames=40)
    assert chunked.shape == whole.shape
    assert ((chunked > 0.5) == (whole > 0.5)).float().mean() > 0.95  # same decisions almost everywhere
    with pytest.raises(ValueError, match="overlap"):
        frame_probs(model, f, chunk_frames=10, overlap_frames=10)


def test_cli_diarize_audio_files(trained, tmp_path, capsys):
    from normlab.cli import main

    model, _ = trained
    model.save(tmp_path / "m.pt")
    audio, _ = _mixture(np.random.default_rng(7))
    sf.write(tmp_path / "talk.flac", audio, 16000 // 2)
    (tmp_path / "empty.wav").write_bytes(b"")
    # the mixture is synthetic, not speech: the VAD gate is switched off so the model alone decides
    rc = main(["diarize", str(tmp_path / "talk.flac"), str(tmp_path / "empty.wav"), "--model", str(tmp_path / "m.pt"),
               "--out", str(tmp_path / "rttm"), "--vad", "off"])
    captured = capsys.readouterr()  # what was written on stdout, the file that failed on stderr
    assert rc == 1 and "talk.rttm" in captured.out and "empty.wav: error" in captured.err
    assert "error" not in captured.out
    assert read_rttm(tmp_path / "rttm" / "talk.rttm")["talk"]
    rc = main(["diarize", "--model", str(tmp_path / "m.pt"), "--vad", "off", "--out", str(tmp_path / "rttm2"),
               str(tmp_path / "talk.flac")])
    assert rc == 0 and (tmp_path / "rttm2" / "talk.rttm").exists()  # options before the files work too
