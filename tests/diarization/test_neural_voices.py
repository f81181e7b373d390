"""Neural voices (data/neural.py): Kokoro-82M and Piper from pinned packages, split by voice, in the simulation."""
import hashlib

import numpy as np
import pytest

from normlab.diarization.data import neural as N
from normlab.diarization.data import voices as V


def _needs(engine: str):
    v = next(v for v in N.VOICES if v.engine == engine)
    if not N.available(v):
        pytest.skip(f"{v.package}, onnxruntime or espeak-ng is not installed ({N.INSTALL})")
    return v


def test_splits_are_disjoint_by_voice_and_cover_every_voice():
    seen = [k for keys in N.SPLIT_VOICES.values() for k in keys]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(v.key for v in N.VOICES)
    for v in N.VOICES:
        assert v.licence and v.package and v.sex in ("f", "m") and v.engine in ("kokoro", "piper")


def test_unknown_voice_and_split_are_clear_errors():
    with pytest.raises(ValueError, match="unknown neural voice"):
        N.voice("nobody")
    with pytest.raises(ValueError, match="split must be"):
        N.installed("validation")


def test_a_corrupt_model_part_is_refused():
    parts = [b"abc", b"def"]
    good = hashlib.sha256(b"abcdef").hexdigest()
    assert N.assemble(parts, good) == b"abcdef"
    with pytest.raises(N.Unavailable, match="SHA-256"):
        N.assemble([b"abc", b"dxf"], good)


def test_piper_input_is_start_phonemes_with_pads_and_end():
    id_map = {"^": [1], "$": [2], "_": [0], "a": [5], "b": [6]}
    assert N.piper_ids("ab?a", id_map) == [1, 5, 0, 6, 0, 5, 0, 2]  # unknown symbols are dropped


@pytest.mark.parametrize("engine", ["kokoro", "piper"])
def test_each_engine_speaks(engine):
    """A sentence comes out as seconds of finite, non-silent audio that Silero VAD hears as speech."""
    import torch

    from normlab.diarization.io.audio import resample
    from normlab.diarization.models.vad import default_vad, speech_probability

    v = _needs(engine)
    audio, sr = N.synthesize(v, "the meeting starts at nine and we talk about the budget")
    assert np.isfinite(audio).all() and 1.5 < len(audio) / sr < 8 and np.abs(audio).max() > 0.05
    wave = torch.from_numpy(resample(audio, sr, 16000))
    frames = int(len(wave) / 1600)
    assert float((speech_probability(default_vad(), wave, frames, 0.1) > 0.5).float().mean()) > 0.5


def test_voices_are_different_people_to_the_speaker_encoder():
    """Two sentences of one voice are closer (GE2E cosine) than sentences of two different voices."""
    import torch

    from normlab.diarization.io.audio import resample
    from normlab.diarization.models.embed import SpeakerEncoder

    keys = ("kokoro_jf_alpha", "kokoro_jm_kumo", "piper_joe")
    for k in keys:
        if not N.available(N.voice(k)):
            pytest.skip(f"{N.voice(k).package} is not installed ({N.INSTALL})")
    enc = SpeakerEncoder.load()
    texts = ("please send the report before friday afternoon", "the river was cold and the road was long")
    emb = {}
    for k in keys:
        for t in texts:
            a, sr = N.synthesize(N.voice(k), t)
            with torch.no_grad():
                mel = enc.mel(torch.from_numpy(resample(a, sr, 16000)))
                emb[k, t] = enc.embed_frames(mel, [torch.arange(mel.shape[0])])[0]
    same = [float(emb[k, texts[0]] @ emb[k, texts[1]]) for k in keys]
    other = [float(emb[a, t] @ emb[b, t]) for t in texts for i, a in enumerate(keys) for b in keys[i + 1:]]
    assert min(same) > max(other), (same, other)


def test_neural_sources_are_the_splits_people_and_voices(monkeypatch):
    from normlab.diarization.data import prompts as P

    monkeypatch.setattr(N, "available", lambda v: True)
    monkeypatch.setattr(P, "installed", lambda split: [P.person(k) for k in P.SPLIT_PERSONS[split]])
    for split in ("train", "dev", "test"):
        pool = V.voices(split, "neural")
        assert sorted(v.name for v in pool if v.synth == "neural") == sorted(N.SPLIT_VOICES[split])
        assert sorted(v.name for v in pool if v.synth == "recorded") == sorted(P.SPLIT_PERSONS[split])
        assert not any(v.real for v in pool if v.synth == "neural")  # real_p draws real people, not these
    monkeypatch.setattr(N, "available", lambda v: False)
    with pytest.raises(N.Unavailable, match="no neural voices"):
        V.voices("dev", "neural")


def test_a_conversation_draws_from_a_voices_bank(tmp_path, monkeypatch):
    """With sources="neural" a conversation's neural speakers speak items of their bank (cached on disk, the same
    items read back), and the model file's provenance names the package, its version and licence."""
    from normlab.diarization.data.conversation import utterances
    from normlab.diarization.training.provenance import sources

    v = _needs("piper")
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(N, "BANK_SENTENCES", 3)
    monkeypatch.setattr(N, "BANK_BACKCHANNELS", 2)
    N.bank.cache_clear()
    try:
        pool = N.bank(v.key)
        assert 3 <= len(pool) <= 5 and list(tmp_path.glob("neural/*.npz"))
        N.bank.cache_clear()
        again = N.bank(v.key)
        assert all(np.array_equal(a, b) for a, b in zip(pool, again))
        utts, short = utterances(V.Voice("neural", v.key, v.key), 4, np.random.default_rng(0), 8000)
        assert len(utts) == 4 and short  # the backchannels are short items
        ratios = [{len(u) / len(p) for p in pool} for u in utts]  # one speed for the speaker: a common ratio
        assert any(0.85 < r < 1.15 and all(any(abs(r - q) < 0.01 for q in rs) for rs in ratios) for r in ratios[0])
    finally:
        N.bank.cache_clear()
    meta = sources([f"neural.{v.key}", "recorded.allison"])
    assert meta["licences"][v.package] == v.licence and meta["packages"][v.package]


def test_mixtures_of_recorded_people_are_refused_in_one_line():
    """Recorded people and neural voices speak from prompts and banks, in conversations; an EEND-style mixture
    of them would ask a synthesizer for a person."""
    from normlab.diarization.data.simulate import SimConfig

    for sources in ("real", "mixed", "neural"):
        with pytest.raises(ValueError, match="style 'conversation'"):
            SimConfig(style="mixture", sources=sources)
        SimConfig(style="conversation", sources=sources)
    SimConfig(style="mixture", sources="all")
